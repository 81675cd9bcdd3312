"""The scheduler: continuous batching over a radix-cached, paged KV pool (SGLang's ``scheduler.py``).

Each ``step()``: admit waiting requests into an extend batch (prefix match, token budget, at most one
chunked request) — extend has priority — else run one decode step over the running requests
(retracting the least-advanced ones when pages run out); then sample, check stops and emit new
tokens. When idle it checks that no KV page or request row leaked.

Transport, model worker, tokenizer and grammar backend come in through the constructor, so the
offline ``Engine`` and tests drive it in-process and the server drives it from a ZMQ loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from radixlm.constrained import GrammarBackend, GrammarCache, GrammarError, GrammarSpec
from radixlm.managers.io_struct import (AbortReq, BatchTokenOut, FinishReason, FlushCacheOut, FlushCacheReq,
                                        GetInternalStateReq, InternalState, Message, TokenizedGenerateReq)
from radixlm.managers.batch_log import BatchLog
from radixlm.managers.hicache_controller import HiCacheController
from radixlm.managers.kv_manager import KVManager
from radixlm.managers.output_builder import build_batch_output
from radixlm.managers.result_processor import ResultProcessor
from radixlm.managers.schedule_batch import Req
from radixlm.managers.schedule_policy import PrefillAdder, order_waiting
from radixlm.managers.speculative import NgramSpeculator
from radixlm.managers.tp_worker import TpModelWorker
from radixlm.managers.validation import (MAX_TOP_LOGPROBS, InvalidRequestError, validate_generate_input,
                                         validate_logprob_start_len, validate_top_logprobs_num)
from radixlm.radix_cache import RadixCache
from radixlm.srt.forward_batch import ForwardMode, ModelWorkerBatch
from radixlm.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
_PREFETCH_WAIT_S = 0.005  # idle wait on a background storage read before the next step
RETRACT_DECODE_STEPS = 20  # after a retraction, reserve this many decode tokens per running request


def create_scheduler_grammar_backend(args: ServerArgs, tokenizer: Any, model_config: Any) -> Optional[GrammarBackend]:
    """The ``--grammar-backend`` for this model (None for ``none``)."""
    from radixlm.constrained import create_grammar_backend

    return create_grammar_backend(args.grammar_backend, tokenizer, model_config.vocab_size,
                                  list(model_config.eos_token_ids), any_whitespace=args.grammar_any_whitespace)


def _grammar_field(params: Any) -> Optional[str]:
    """The sampling field holding the request's grammar (named in a grammar error's ``param``)."""
    return next((f for f in ("json_schema", "regex", "ebnf", "structural_tag") if getattr(params, f) is not None),
                None)


class Scheduler:
    def __init__(self, server_args: ServerArgs, worker: TpModelWorker, tokenizer: Any,
                 send_output: Callable[[BatchTokenOut], None], grammar_backend: Optional[GrammarBackend] = None):
        self.args = server_args
        self.worker = worker
        self.tokenizer = tokenizer
        self.send_output = send_output
        self.grammar_backend = grammar_backend
        self.grammar_cache = GrammarCache(grammar_backend) if grammar_backend is not None else None
        # With several TP ranks, "is the grammar compiled yet" must not depend on timing.
        self.grammar_blocking = worker.model_runner.tp.size > 1
        self.grammar_queue: list[Req] = []
        mc = worker.model_config
        self.context_len = mc.context_len
        self.vocab_size = mc.vocab_size
        self.eos_ids = frozenset(mc.eos_token_ids)
        runner = worker.model_runner
        self.hicache = HiCacheController(server_args, runner) if server_args.enable_hierarchical_cache else None
        tree = RadixCache(runner.page_pool, server_args.page_size, disable=server_args.disable_radix_cache,
                          listener=self.hicache)
        self.kv = KVManager(runner.page_pool, tree, runner.req_to_token_pool, tiers=self.hicache)
        self.results = ResultProcessor(self.kv, tokenizer, top_logprobs_cap=MAX_TOP_LOGPROBS)
        # --speculative-algorithm NGRAM: decode steps with drafts become verify steps.
        self.spec = (NgramSpeculator(server_args, self.kv, self.context_len, self.vocab_size)
                     if server_args.speculative_algorithm is not None else None)
        self.waiting: list[Req] = []
        self.prefetch_held: set[str] = set()  # rids held back by --hicache-storage-prefetch-policy this step
        self.running: list[Req] = []
        self.chunked_req: Optional[Req] = None
        self.init_ratio = min(1.0, INIT_NEW_TOKEN_RATIO * server_args.schedule_conservativeness)
        self.new_token_ratio = self.init_ratio
        self.min_ratio = self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.stats = {"retractions": 0, "prompt_tokens": 0, "generation_tokens": 0, "cached_tokens": 0}
        # Seconds spent in whole steps and in the model forward + sampling (the rest is overhead).
        self.timing = {"steps": 0, "step_s": 0.0, "forward_s": 0.0}
        self.batch_log = BatchLog(server_args.decode_log_interval, self.kv.total_tokens)
        self._extend_hits = 0  # radix-cache tokens of the requests the last extend batch started

    # ---- the loop ---------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one batch if there is work; returns False when idle (after the leak check)."""
        t0 = time.perf_counter()
        self._reap_aborted()
        self._poll_grammar_queue()
        batch = self._get_new_extend_batch() or self._get_decode_batch()
        if batch is None:
            if self.prefetch_held:  # waiting for storage reads, nothing else to run
                assert self.hicache is not None
                self.hicache.wait_prefetch(self.prefetch_held, _PREFETCH_WAIT_S)
                return True
            if self.waiting or self.chunked_req is not None:
                self._abort_unschedulable()
                return True
            if self.grammar_queue:
                return True  # grammars still compiling
            self.new_token_ratio = self.init_ratio
            self.kv.check_idle()
            return False
        reqs, mwb = batch
        running_before, outputs_before = len(self.running), sum(len(r.output_ids) for r in reqs)
        allocated = [(r.num_cached, r.num_cached + r.extend_len) for r in reqs]  # this batch's KV slots
        try:
            if mwb.forward_mode is ForwardMode.TARGET_VERIFY:
                assert self.spec is not None
                t1 = time.perf_counter()
                out = self.worker.forward_batch_generation(mwb, None)  # logits only: targets drawn per row
                t2 = time.perf_counter()
                finished = self.spec.process(reqs, mwb, out, self.results.decode_text, MAX_TOP_LOGPROBS)
            else:
                sampling = self.results.sampling_inputs(reqs, mwb, self.vocab_size)
                t1 = time.perf_counter()
                out = self.worker.forward_batch_generation(mwb, *sampling)
                t2 = time.perf_counter()
                finished = self.results.process(reqs, mwb, out)
        except BaseException as exc:
            self._fail_batch(reqs, allocated, exc)
            raise
        self._after_batch(reqs, mwb.forward_mode, finished)
        self._log_batch(reqs, mwb, running_before, outputs_before)
        self.timing["steps"] += 1
        self.timing["forward_s"] += t2 - t1
        self.timing["step_s"] += time.perf_counter() - t0
        return True

    def _fail_batch(self, reqs: list[Req], allocated: list[tuple[int, int]], exc: BaseException) -> None:
        """The batch's forward (or the processing of its results) raised: end its requests with
        finish_reason abort (status 500) and free what the batch allocated, before the exception
        propagates. ``allocated[i]`` is ``(num_cached, num_cached + extend_len)`` of ``reqs[i]`` when the
        batch was built: the positions it was given KV slots for. ``num_cached`` only advances when a
        forward's results are processed, so a request whose ``num_cached`` did not move has no computed
        KV in those slots: they are freed, and only what was computed before (its cached prefix, earlier
        chunks and outputs) goes into the tree. (Without this the failed step's slots stayed allocated,
        and an Engine caller that caught the exception saw the next idle check report a KV leak.)"""
        reason = FinishReason(type="abort", status_code=500, message=(
            f"internal error in the model forward ({type(exc).__name__}); the server log has the traceback"))
        failed = {id(r) for r in reqs}
        for r, (start, end) in zip(reqs, allocated):
            if r.req_pool_idx is not None:
                if r.num_cached == start:
                    self.kv.free_beyond_cached(r, end)
                self.kv.release(r, insert=True)
            r.finished_reason = reason
            if r is self.chunked_req:
                self.chunked_req = None
        self.running = [r for r in self.running if id(r) not in failed]
        self._emit(reqs)

    def _log_batch(self, reqs: list[Req], mwb: ModelWorkerBatch, running_before: int, outputs_before: int) -> None:
        log, kv = self.batch_log, self.kv
        log.generated_tokens(sum(len(r.output_ids) for r in reqs) - outputs_before)
        used = kv.total_tokens - kv.available_tokens()
        if mwb.forward_mode is ForwardMode.EXTEND:
            log.extend(len(reqs), len(mwb.input_ids), self._extend_hits, used, running_before, len(self.waiting))
        else:
            log.decode(len(self.running), used, len(self.waiting))

    def _abort_unschedulable(self) -> None:
        """Nothing runs, yet the head request cannot be admitted: even an empty pool cannot hold it.
        End it rather than wait forever."""
        head = self.chunked_req or self.waiting[0]
        head.to_abort = FinishReason(type="abort", status_code=503, message=(
            f"out of KV cache memory: the request needs more than the pool's {self.kv.total_tokens} tokens; "
            "raise --max-total-tokens"))
        if head is self.chunked_req:
            self._reap_aborted()
        else:
            self.waiting.pop(0)
            head.finished_reason = head.to_abort
            self._emit([head])

    def _pool_full_message(self) -> str:
        return (f"the output reached the KV cache's capacity ({self.kv.total_tokens} tokens with the prompt); "
                "raise --max-total-tokens for longer outputs")

    def is_idle(self) -> bool:
        return not self.waiting and not self.running and self.chunked_req is None and not self.grammar_queue

    # ---- inputs -------------------------------------------------------------------------------
    def handle_message(self, msg: Message) -> Optional[Message]:
        """Dispatch one incoming message; returns a reply for control messages."""
        if isinstance(msg, TokenizedGenerateReq):
            self.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.abort(msg.rid, msg.abort_all, msg.message, msg.exact)
        elif isinstance(msg, FlushCacheReq):
            return self.flush_storage() if msg.storage else self.flush_cache()
        elif isinstance(msg, GetInternalStateReq):
            return self.internal_state()
        else:
            raise TypeError(f"scheduler cannot handle {type(msg).__name__}")
        return None

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        params = msg.sampling_params
        stop_ids = frozenset(params.stop_token_ids or ()) | (frozenset() if params.ignore_eos else self.eos_ids)
        room = self.context_len - len(msg.input_ids)
        max_new = room if params.max_new_tokens is None else min(params.max_new_tokens, room)
        # Output beyond what the whole KV pool can hold next to the prompt can never be computed:
        # such a request ends with finish_reason length there (and says why), never with an error.
        pool_room = self.kv.total_tokens - len(msg.input_ids)
        req = Req(msg, stop_ids, max(min(max_new, pool_room), 0))
        if self.spec is not None:
            self.spec.on_new_request(req)
        if pool_room < max_new:
            req.length_message = self._pool_full_message()
        error, param = self._validate(msg), None
        if error is None:
            queued, error = self._queue_grammar(req)
            if queued:
                return
            param = _grammar_field(params)
        if error is not None:
            req.finished_reason = FinishReason(type="abort", message=error, status_code=400, param=param)
            self._emit([req])
            return
        self.waiting.append(req)

    def _queue_grammar(self, req: Req) -> tuple[bool, Optional[str]]:
        """Start compiling the request's grammar. Returns (queued in the grammar queue, error)."""
        try:
            spec = GrammarSpec.from_sampling_params(req.sampling_params)
        except GrammarError as e:
            return False, str(e)
        if spec is None:
            return False, None
        if self.grammar_cache is None:
            return False, "grammar-constrained decoding is off on this server (--grammar-backend none)"
        req.grammar_future = self.grammar_cache.request(spec)
        req.grammar_deadline = time.monotonic() + self.args.grammar_compile_timeout
        self.grammar_queue.append(req)
        return True, None

    def _poll_grammar_queue(self) -> None:
        """Move requests whose grammar compiled to the waiting queue (FIFO); fail the others."""
        if not self.grammar_queue:
            return
        # Nothing else to do: wait a little for the first grammar instead of spinning.
        block = not self.waiting and not self.running and self.chunked_req is None
        still, failed = [], []
        for req in self.grammar_queue:
            fut = req.grammar_future
            timeout = max(req.grammar_deadline - time.monotonic(), 0) if self.grammar_blocking else (0.03 if block else 0)
            try:
                compiled = fut.result(timeout=timeout) if timeout or fut.done() else None
            except GrammarError as e:
                req.finished_reason = FinishReason(type="abort", status_code=400, message=str(e),
                                                   param=_grammar_field(req.sampling_params))
                failed.append(req)
                continue
            except TimeoutError:
                compiled = None
            if compiled is not None:
                req.grammar = self.grammar_backend.new_matcher(compiled)  # type: ignore[union-attr]
                self.waiting.append(req)
            elif time.monotonic() > req.grammar_deadline:
                req.finished_reason = FinishReason(type="abort", status_code=400, message=(
                    f"grammar compilation took longer than --grammar-compile-timeout "
                    f"{self.args.grammar_compile_timeout:g} s"))
                failed.append(req)
            else:
                still.append(req)
            block = False
        self.grammar_queue = still
        if failed:
            self._emit(failed)

    def _validate(self, msg: TokenizedGenerateReq) -> Optional[str]:
        try:
            validate_generate_input(msg.input_ids, msg.sampling_params, self.vocab_size, self.context_len)
            validate_top_logprobs_num(msg.top_logprobs_num)
            validate_logprob_start_len(msg.logprob_start_len, len(msg.input_ids), msg.return_logprob)
        except InvalidRequestError as e:
            return str(e)
        if len(msg.input_ids) + 1 > self.kv.total_tokens:
            return (f"the input ({len(msg.input_ids)} tokens) does not fit in the KV cache "
                    f"({self.kv.total_tokens} tokens)")
        return None

    def abort(self, rid: str, abort_all: bool = False, message: str = "Aborted by request", exact: bool = False) -> None:
        """Abort requests whose rid starts with ``rid`` (equals it if ``exact``; or all). Waiting ones
        end at once; running ones end at the start of the next step, after their KV is cached."""
        def match(r: Req) -> bool:
            return abort_all or (r.rid == rid if exact else r.rid.startswith(rid))

        gone = [r for r in self.waiting + self.grammar_queue if match(r)]
        if gone:
            self.waiting = [r for r in self.waiting if not match(r)]
            self.grammar_queue = [r for r in self.grammar_queue if not match(r)]
            for r in gone:
                r.finished_reason = FinishReason(type="abort", message="Abort in waiting queue")
                self.kv.release(r, insert=False)
            self._emit(gone)
        for r in self.running + ([self.chunked_req] if self.chunked_req else []):
            if match(r) and r.to_abort is None:
                r.to_abort = FinishReason(type="abort", message=message)

    def _reap_aborted(self) -> None:
        done = [r for r in self.running if r.to_abort is not None]
        if self.chunked_req is not None and self.chunked_req.to_abort is not None:
            done.append(self.chunked_req)
            self.chunked_req = None
        if not done:
            return
        self.running = [r for r in self.running if r.to_abort is None]
        for r in done:
            r.finished_reason = r.to_abort
            self.kv.release(r, insert=True)
        self._emit(done)

    # ---- batches ----------------------------------------------------------------------------
    def _get_new_extend_batch(self) -> Optional[tuple[list[Req], ModelWorkerBatch]]:
        self.prefetch_held = set()
        if self.hicache is not None:
            self.hicache.sync_prefetch(self.kv, self.waiting)
        if not self.waiting and self.chunked_req is None:
            return None
        args = self.args
        chunk = None if args.chunked_prefill_size == -1 else args.chunked_prefill_size
        # --enable-mixed-chunk: the running requests' decode tokens ride in this batch and take their
        # share of its token budgets (SGLang's PrefillAdder(mixed_with_decode_tokens)).
        # At least one token is left to the extend, so a batch of more running requests than the budget
        # still lets the waiting ones in (a token at a time at worst) instead of starving them.
        mixing = self._may_mix()
        decode_tokens = len(self.running) if mixing else 0
        adder = PrefillAdder(self.kv, self.new_token_ratio, max(args.max_prefill_tokens - decode_tokens, 1),
                             None if chunk is None else max(chunk - decode_tokens, 1))
        adder.reserve_running(self.running)
        candidates = ([self.chunked_req] if self.chunked_req else []) + order_waiting(self.waiting, args.schedule_policy, self.kv)
        self._extend_hits = 0
        if self.hicache is not None:  # requests whose prefix is still being read from storage wait
            self.prefetch_held = self.hicache.held([r for r in candidates if r.req_pool_idx is None])
        for req in candidates:
            if req.rid in self.prefetch_held:
                continue
            if len(self.running) + len(adder.admitted) >= args.max_running_requests or adder.new_chunked_req:
                break
            fresh = req.req_pool_idx is None
            if fresh and not self.kv.match_and_lock(req):
                break
            if fresh and adder.defer_for_shared_prefix(req):
                self.kv.release(req, insert=False)
                continue
            size = adder.extend_size(req)
            if size is None or not adder.fits(req, size):
                if fresh:
                    self.kv.release(req, insert=False)
                break
            if fresh and req.num_retractions == 0:
                req.cached_tokens = req.num_cached  # retracted requests stop counting (SGLang)
                req.cached_tokens_details = req.match_tiers
            if fresh:
                self._extend_hits += req.num_cached
            self.kv.alloc_tokens(req, size)
            adder.add(req, size)
        if not adder.admitted:
            return None
        admitted = set(map(id, adder.admitted))
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        self.chunked_req = adder.new_chunked_req
        reqs = adder.admitted + (self._mix_running() if mixing else [])
        return reqs, self._build_extend(reqs)

    def _may_mix(self) -> bool:
        return self.args.enable_mixed_chunk and self.spec is None and bool(self.running)

    def _mix_running(self) -> list[Req]:
        """The running requests with a KV slot each for their decode token (an extend of one: the
        kernels compute it bitwise as in a decode batch), or none when the pool is short of slots;
        they then wait for a decode step, which retracts as usual."""
        reqs = [r for r in self.running if r.to_abort is None]
        if self.kv.alloc_decode(reqs) is None:
            return []
        for r in reqs:
            r.extend_len = 1
        return reqs

    def _build_extend(self, reqs: list[Req]) -> ModelWorkerBatch:
        input_ids: list[int] = []
        slots: list[int] = []
        lp_starts: list[Optional[int]] = []
        table = self.kv.req_to_token_pool.req_to_token
        for r in reqs:
            start = r.num_cached
            input_ids.extend(r.fill_ids[start:start + r.extend_len])
            slots.extend(table[r.req_pool_idx, start:start + r.extend_len].tolist())
            wants = not r.input_logprobs_done and r.logprob_start_len is not None
            lp_starts.append(max(0, max(r.logprob_start_len - 1, 0) - start) if wants else None)  # type: ignore[operator]
        return ModelWorkerBatch(ForwardMode.EXTEND, input_ids, [r.req_pool_idx for r in reqs],
                                [r.num_cached for r in reqs], [r.extend_len for r in reqs], slots, lp_starts)

    def _get_decode_batch(self) -> Optional[tuple[list[Req], ModelWorkerBatch]]:
        if not self.running:
            return None
        self._retract_if_needed()
        if not self.running:  # the last one ended: the freed pool may admit what waits
            return self._get_new_extend_batch()
        reqs = list(self.running)
        mwb = self.spec.build_verify_batch(reqs) if self.spec is not None else None
        if mwb is None:
            for r in reqs:
                r.extend_len = 1
            slots = self.kv.alloc_decode(reqs)
            assert slots is not None, "retraction leaves room for one token per running request"
            mwb = ModelWorkerBatch(ForwardMode.DECODE, [r.output_ids[-1] for r in reqs], [r.req_pool_idx for r in reqs],
                                   [r.num_cached for r in reqs], [1] * len(reqs), slots)
        self.new_token_ratio = max(self.min_ratio, self.new_token_ratio - (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS)
        return reqs, mwb

    def _retract_if_needed(self) -> None:
        """Free KV of the least-advanced requests until every running one can take a decode token."""
        def need() -> int:
            return sum(self.kv.pages_needed(r, 1) for r in self.running) * self.kv.page_size

        # Fewest outputs first; among equals, the longest prompt (most memory) first.
        order = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
        retracted = []
        while need() > self.kv.available_tokens():
            if len(self.running) == 1 and self.chunked_req is not None:
                victim = self.chunked_req  # a half-done prefill yields to the running request
                self.chunked_req = None
            elif len(self.running) == 1:
                # Unreachable while add_request caps max_new_tokens at the pool; if it happens,
                # the request keeps its output and ends as if it had reached its length limit.
                r = self.running.pop()
                r.finished_reason = FinishReason(type="length", length=len(r.output_ids),
                                                 message=self._pool_full_message())
                self.kv.release(r, insert=True)
                self._emit([r])
                break
            else:
                victim = order.pop(0)
                self.running.remove(victim)
            self.kv.release(victim, insert=False)
            victim.reset_for_retract()
            retracted.append(victim)
        if retracted:
            self.stats["retractions"] += len(retracted)
            self.waiting = retracted + self.waiting
            total_new = sum(r.max_new_tokens for r in self.running) or 1
            decoded = sum(len(r.output_ids) for r in self.running)
            # SGLang's retract_decode: 20 more decode steps for each request still running.
            self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / total_new)
            logger.info("retracted %d request(s); new_token_ratio %.3f", len(retracted), self.new_token_ratio)

    def _after_batch(self, reqs: list[Req], mode: ForwardMode, finished: list[Req]) -> None:
        for r in finished:
            self.kv.release(r, insert=True)
        done = set(map(id, finished))
        if mode is ForwardMode.EXTEND:
            decoding = set(map(id, self.running))  # mixed in by --enable-mixed-chunk: already running
            for r in reqs:
                if id(r) in done or id(r) in decoding:
                    continue
                self.kv.cache_unfinished(r)
                if r is not self.chunked_req:
                    self.running.append(r)
        self.running = [r for r in self.running if id(r) not in done]
        self._emit([r for r in reqs if id(r) in done or (r.stream and self._stream_due(r))])

    def _stream_due(self, r: Req) -> bool:
        """A streamed request is sent its first token at once, then every ``stream_interval`` tokens."""
        interval = r.sampling_params.stream_interval or self.args.stream_interval
        return r.num_sent == 0 or len(r.output_ids) - r.num_sent >= interval

    def _emit(self, reqs: list[Req]) -> None:
        out = build_batch_output(reqs, self.stats)
        if out is not None:
            self.send_output(out)

    # ---- control --------------------------------------------------------------------------
    def flush_cache(self) -> FlushCacheOut:
        if not self.is_idle():
            return FlushCacheOut(success=False, message="cannot flush the cache while requests are queued or running")
        self.kv.flush()
        if self.grammar_cache is not None:
            self.grammar_cache.clear()
        return FlushCacheOut(success=True)

    def flush_storage(self) -> FlushCacheOut:
        """Delete the hierarchical cache's storage files (``/clear_hicache_storage_backend``)."""
        if self.hicache is None or self.hicache.storage is None:
            return FlushCacheOut(success=False, message="no hierarchical cache storage backend on this server "
                                                        "(--enable-hierarchical-cache --hicache-storage-backend file)")
        n = self.hicache.flush_storage()
        return FlushCacheOut(success=True, message=f"deleted {n} page files")

    def close(self) -> None:
        """Finish background work that must not be lost (queued storage writes)."""
        if self.hicache is not None:
            self.hicache.close(self.kv.tree)

    def _hicache_state(self) -> dict[str, float]:
        if self.hicache is None:
            return {}
        per_tier = {k: v for k, v in self.stats.items() if k.startswith("cached_tokens_")}
        return {**per_tier, **self.hicache.state()}

    def internal_state(self) -> InternalState:
        kv = self.kv
        spec = self.spec.stats if self.spec is not None else dict.fromkeys(
            ("verify_steps", "draft_tokens", "accepted_drafts", "verify_tokens"), 0)
        return InternalState(
            max_total_num_tokens=kv.total_tokens, available_size=kv.pool.available_size,
            evictable_size=kv.tree.evictable_size(), protected_size=kv.tree.protected_size(),
            num_running_reqs=len(self.running) + (self.chunked_req is not None),
            num_waiting_reqs=len(self.waiting) + len(self.grammar_queue),
            num_retractions=self.stats["retractions"], num_prompt_tokens=self.stats["prompt_tokens"],
            num_generation_tokens=self.stats["generation_tokens"], num_cached_tokens=self.stats["cached_tokens"],
            page_size=self.args.page_size, context_len=self.context_len,
            num_grammar_compiles=self.grammar_cache.num_compiles if self.grammar_cache is not None else 0,
            num_grammar_cache_hits=self.grammar_cache.num_hits if self.grammar_cache is not None else 0,
            gen_throughput=self.batch_log.gen_throughput, new_token_ratio=self.new_token_ratio,
            num_spec_verify_steps=spec["verify_steps"], num_spec_draft_tokens=spec["draft_tokens"],
            num_spec_accepted_drafts=spec["accepted_drafts"], num_spec_verify_tokens=spec["verify_tokens"],
            attention_backend=self.worker.model_runner.attn_backend.name,
            gemm_backend=self.worker.model_runner.gemm_backend.name,
            elementwise_backend=self.worker.model_runner.elementwise_backend.name,
            quantization=self.worker.model_runner.quantization.method,
            quantized_layers=dict(self.worker.model_runner.quantization.layers), hicache=self._hicache_state())
