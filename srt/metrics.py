"""Prometheus metrics of one server (``GET /metrics``), SGLang's series under a ``radixlm:`` prefix.

Everything lives on a private ``CollectorRegistry`` owned by a ``ServerMetrics`` instance (no
module-level state), so several servers or tests in one process never collide.

Every series that comes from a scheduler's ``InternalState`` (and the routing series) carries a
``dp_rank`` label, one series per data-parallel replica (``--dp-size``; ``"0"`` alone without it); the
request counters and the histograms are server-wide.

Series (units in the names):
- counters, fed by the TokenizerManager as outputs arrive: ``radixlm:prompt_tokens_total``,
  ``radixlm:generation_tokens_total``, ``radixlm:cached_tokens_total``, ``radixlm:num_requests_total``,
  ``radixlm:num_aborted_requests_total``;
- gauges, set from each scheduler's ``InternalState`` at scrape time: ``radixlm:cache_hit_rate`` (cached /
  prompt tokens since start), ``radixlm:num_running_reqs``, ``radixlm:num_queued_reqs``,
  ``radixlm:token_usage`` (fraction of the KV pool held by requests; evictable cached prefixes count as
  free), ``radixlm:max_total_num_tokens``, ``radixlm:gen_throughput`` (tokens/s over the last decode log
  window), ``radixlm:new_token_ratio`` (the admission's estimate of the share of ``max_new_tokens``
  requests use); counters advanced from the scheduler's totals at scrape time:
  ``radixlm:num_retracted_reqs_total`` (requests retracted to free KV), ``radixlm:grammar_compiles_total``,
  ``radixlm:grammar_cache_hits_total``;
- hierarchical cache (``--enable-hierarchical-cache``; 0 without it), gauges from the same state:
  ``radixlm:cached_tokens_by_tier{tier="device|host|storage"}`` (prompt tokens served from each tier since
  start), ``radixlm:hicache_host_used_tokens``, ``radixlm:hicache_host_capacity_tokens``,
  ``radixlm:hicache_storage_bytes``, ``radixlm:hicache_storage_files``, ``radixlm:hicache_storage_bad_files``
  (invalid page files skipped since start);
- speculative decoding (``--speculative-algorithm``; 0 while off), counters advanced from the scheduler's
  totals at scrape time: ``radixlm:spec_verify_steps_total`` (request-steps that verified a draft),
  ``radixlm:spec_draft_tokens_total``, ``radixlm:spec_accepted_tokens_total`` (drafted tokens accepted),
  ``radixlm:spec_verify_output_tokens_total`` (output tokens of verify steps: accepted + bonus); gauges
  ``radixlm:spec_accept_length`` (output tokens per verify step since start) and ``radixlm:spec_accept_rate``
  (accepted / drafted tokens);
- routing (per ``dp_rank``, from the ``DataParallelController``): ``radixlm:routed_requests_total``
  (requests sent to the replica) and the gauge ``radixlm:dp_load`` (requests routed there and not finished);
- histograms: ``radixlm:time_to_first_token_seconds`` and ``radixlm:inter_token_latency_seconds``
  (streaming requests), ``radixlm:e2e_request_latency_seconds``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixlm.managers.io_struct import InternalState

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
PREFIX = "radixlm:"


class ServerMetrics:
    """The collectors of one server. ``content_type`` is the exposition format's MIME type.

    Args: model_name (the ``model_name`` label), dp_size (replicas: one ``dp_rank`` series each)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, dp_size: int = 1) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        self._labels = {"model_name": model_name}

        # Each collector is bound to its label values at once, so every series exists from the start.
        def counter(name: str, doc: str) -> Any:
            return Counter(PREFIX + name, doc, labels, registry=self.registry).labels(**self._labels)

        def histogram(name: str, doc: str) -> Any:
            return Histogram(PREFIX + name, doc, labels, buckets=_LATENCY_BUCKETS,
                             registry=self.registry).labels(**self._labels)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the radix cache")
        self.num_requests = counter("num_requests", "Finished requests")
        self.num_aborted = counter("num_aborted_requests", "Requests that ended with finish_reason abort")
        families = _ReplicaFamilies(self.registry, labels + ["dp_rank"])
        self.replicas = [_ReplicaSeries(families, {**self._labels, "dp_rank": str(r)}) for r in range(dp_size)]
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token (streaming requests)")
        self.itl = histogram("inter_token_latency_seconds", "Time between streamed outputs, per token")
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish")

    # ---- per request (TokenizerManager) ------------------------------------------------------
    def observe_tokens(self, num_new_tokens: int) -> None:
        self.generation_tokens.inc(num_new_tokens)

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_inter_token(self, seconds: float, num_tokens: int) -> None:
        """``seconds`` since the previous output, which brought ``num_tokens`` (>= 1) new tokens."""
        per_token = seconds / max(num_tokens, 1)
        for _ in range(max(num_tokens, 1)):
            self.itl.observe(per_token)

    def observe_finished(self, prompt_tokens: int, cached_tokens: int, e2e_seconds: float, aborted: bool) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.num_requests.inc()
        if aborted:
            self.num_aborted.inc()
        self.e2e.observe(e2e_seconds)

    # ---- at scrape time ----------------------------------------------------------------------
    def set_scheduler_states(self, states: Sequence[InternalState],
                             routing: Optional[Sequence[dict[str, int]]] = None) -> None:
        """Refresh each replica's series from its scheduler's counters (``states[r]`` is replica
        ``r``) and, when given, the router's ``replica_stats()``."""
        for r, state in enumerate(states):
            self.replicas[r].set(state, routing[r] if routing is not None else None)

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)


class _ReplicaFamilies:
    """The labelled collectors (``model_name``, ``dp_rank``) of the per-replica series."""

    def __init__(self, registry: CollectorRegistry, labels: list[str]) -> None:
        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(PREFIX + name, doc, labels + list(extra), registry=registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=registry)

        self.cache_hit_rate = gauge("cache_hit_rate", "Cached / prompt tokens since start")
        self.num_running = gauge("num_running_reqs", "Requests in the running batch")
        self.num_queued = gauge("num_queued_reqs", "Requests waiting in the scheduler queue")
        self.token_usage = gauge("token_usage", "Fraction of KV slots held by requests")
        self.max_total_tokens = gauge("max_total_num_tokens", "KV pool size in tokens")
        self.gen_throughput = gauge("gen_throughput", "Generated tokens/s over the last decode log window")
        self.new_token_ratio = gauge("new_token_ratio", "Admission's estimate of the share of max_new_tokens used")
        self.retracted = counter("num_retracted_reqs", "Requests retracted (KV freed, requeued) since start")
        self.grammar_compiles = counter("grammar_compiles", "Grammars compiled (cache misses)")
        self.grammar_cache_hits = counter("grammar_cache_hits", "Grammar requests served from the compile cache")
        self.cached_by_tier = gauge("cached_tokens_by_tier", "Prompt tokens served from each KV tier since start",
                                    ("tier",))
        self.host_used = gauge("hicache_host_used_tokens", "Tokens held by the hierarchical cache's host pool")
        self.host_capacity = gauge("hicache_host_capacity_tokens", "Host pool size in tokens")
        self.storage_bytes = gauge("hicache_storage_bytes", "Bytes of page files in the storage tier")
        self.storage_files = gauge("hicache_storage_files", "Page files in the storage tier")
        self.storage_bad = gauge("hicache_storage_bad_files", "Invalid page files skipped (and deleted) since start")
        self.spec_verify_steps = counter("spec_verify_steps", "Request-steps that verified a speculative draft")
        self.spec_draft_tokens = counter("spec_draft_tokens", "Speculative tokens drafted")
        self.spec_accepted_tokens = counter("spec_accepted_tokens", "Speculative tokens drafted and accepted")
        self.spec_verify_output_tokens = counter("spec_verify_output_tokens",
                                                 "Output tokens of verify steps (accepted drafts + bonus tokens)")
        self.spec_accept_length = gauge("spec_accept_length", "Output tokens per verify step since start")
        self.spec_accept_rate = gauge("spec_accept_rate", "Accepted / drafted speculative tokens since start")
        self.routed = counter("routed_requests", "Requests the data-parallel controller sent to the replica")
        self.dp_load = gauge("dp_load", "Requests routed to the replica and not finished yet")


class _ReplicaSeries:
    """One replica's series, bound to its label values."""

    def __init__(self, f: _ReplicaFamilies, labels: dict[str, str]) -> None:
        self.cache_hit_rate = f.cache_hit_rate.labels(**labels)
        self.num_running = f.num_running.labels(**labels)
        self.num_queued = f.num_queued.labels(**labels)
        self.token_usage = f.token_usage.labels(**labels)
        self.max_total_tokens = f.max_total_tokens.labels(**labels)
        self.gen_throughput = f.gen_throughput.labels(**labels)
        self.new_token_ratio = f.new_token_ratio.labels(**labels)
        self.totals = tuple(c.labels(**labels) for c in (f.retracted, f.grammar_compiles, f.grammar_cache_hits))
        self._totals_seen = (0, 0, 0)
        self.cached_by_tier = {t: f.cached_by_tier.labels(tier=t, **labels) for t in ("device", "host", "storage")}
        self.host_used = f.host_used.labels(**labels)
        self.host_capacity = f.host_capacity.labels(**labels)
        self.storage_bytes = f.storage_bytes.labels(**labels)
        self.storage_files = f.storage_files.labels(**labels)
        self.storage_bad = f.storage_bad.labels(**labels)
        self.spec_counters = tuple(c.labels(**labels) for c in (f.spec_verify_steps, f.spec_draft_tokens,
                                                                f.spec_accepted_tokens, f.spec_verify_output_tokens))
        self.spec_accept_length = f.spec_accept_length.labels(**labels)
        self.spec_accept_rate = f.spec_accept_rate.labels(**labels)
        self.routed = f.routed.labels(**labels)
        self.dp_load = f.dp_load.labels(**labels)
        # The scheduler's and the router's totals at the previous scrape (they only grow).
        self._spec_seen = (0, 0, 0, 0)
        self._routed_seen = 0

    def set(self, state: InternalState, routing: Optional[dict[str, int]]) -> None:
        total = max(state.max_total_num_tokens, 1)
        self.num_running.set(state.num_running_reqs)
        self.num_queued.set(state.num_waiting_reqs)
        held = state.max_total_num_tokens - state.available_size - state.evictable_size
        self.token_usage.set(held / total)
        self.max_total_tokens.set(state.max_total_num_tokens)
        prompt = state.num_prompt_tokens
        self.cache_hit_rate.set(state.num_cached_tokens / prompt if prompt else 0.0)
        self.gen_throughput.set(state.gen_throughput)
        self.new_token_ratio.set(state.new_token_ratio)
        self._totals_seen = _advance(self.totals, (state.num_retractions, state.num_grammar_compiles,
                                                   state.num_grammar_cache_hits), self._totals_seen)
        h = state.hicache
        for tier, g in self.cached_by_tier.items():
            g.set(h.get(f"cached_tokens_{tier}", 0))
        self.host_used.set(h.get("host_used_tokens", 0))
        self.host_capacity.set(h.get("host_capacity_tokens", 0))
        self.storage_bytes.set(h.get("storage_bytes", 0))
        self.storage_files.set(h.get("storage_files", 0))
        self.storage_bad.set(h.get("storage_skipped_bad", 0))
        self._set_spec(state)
        if routing is not None:
            self.dp_load.set(routing["load"])
            if routing["num_routed_reqs"] > self._routed_seen:
                self.routed.inc(routing["num_routed_reqs"] - self._routed_seen)
                self._routed_seen = routing["num_routed_reqs"]

    def _set_spec(self, state: InternalState) -> None:
        now = (state.num_spec_verify_steps, state.num_spec_draft_tokens, state.num_spec_accepted_drafts,
               state.num_spec_verify_tokens)
        self._spec_seen = _advance(self.spec_counters, now, self._spec_seen)  # type: ignore[assignment]
        steps, drafted, accepted, emitted = now
        self.spec_accept_length.set(emitted / steps if steps else 0.0)
        self.spec_accept_rate.set(accepted / drafted if drafted else 0.0)


def _advance(counters: Sequence[Any], totals: Sequence[int], seen: Sequence[int]) -> tuple[int, ...]:
    """Advance Prometheus counters to a scheduler's running totals (which only grow); returns the
    totals seen so far, for the next scrape."""
    for counter, total, before in zip(counters, totals, seen):
        if total > before:
            counter.inc(total - before)
    return tuple(max(t, b) for t, b in zip(totals, seen))
