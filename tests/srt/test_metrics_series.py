"""``ServerMetrics`` (``GET /metrics``) from schedulers' ``InternalState`` at scrape time: the series
SGLang's dashboards read besides the token counters (retractions, grammar cache, gen throughput,
new-token ratio), per ``dp_rank``, counters that only ever grow."""

from prometheus_client.parser import text_string_to_metric_families

from radixlm.managers.io_struct import InternalState
from radixlm.srt.metrics import ServerMetrics


def _state(**fields) -> InternalState:
    base = dict(max_total_num_tokens=1000, available_size=600, evictable_size=100, protected_size=0,
                num_running_reqs=2, num_waiting_reqs=1, num_retractions=0, num_prompt_tokens=0,
                num_generation_tokens=0, num_cached_tokens=0, page_size=1, context_len=2048)
    return InternalState(**{**base, **fields})


def _samples(metrics: ServerMetrics) -> dict[tuple[str, str], float]:
    """(sample name, dp_rank) -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, s.labels.get("dp_rank", ""))] = s.value
    return out


def test_scheduler_series_follow_each_replicas_state():
    metrics = ServerMetrics("m", dp_size=2)
    metrics.set_scheduler_states([
        _state(num_retractions=3, num_grammar_compiles=2, num_grammar_cache_hits=5, gen_throughput=812.4,
               new_token_ratio=0.55),
        _state(num_retractions=1),
    ])
    got = _samples(metrics)
    assert got[("radixlm:num_retracted_reqs_total", "0")] == 3 and got[("radixlm:num_retracted_reqs_total", "1")] == 1
    assert got[("radixlm:grammar_compiles_total", "0")] == 2 and got[("radixlm:grammar_cache_hits_total", "0")] == 5
    assert got[("radixlm:gen_throughput", "0")] == 812.4 and got[("radixlm:new_token_ratio", "0")] == 0.55
    assert got[("radixlm:token_usage", "0")] == 0.3  # 1000 - 600 free - 100 evictable

    # The next scrape: counters advance by the scheduler's growth; gauges take the new values.
    metrics.set_scheduler_states([_state(num_retractions=7, gen_throughput=0.0, new_token_ratio=0.7),
                                  _state(num_retractions=1)])
    got = _samples(metrics)
    assert got[("radixlm:num_retracted_reqs_total", "0")] == 7 and got[("radixlm:num_retracted_reqs_total", "1")] == 1
    assert got[("radixlm:grammar_compiles_total", "0")] == 2  # a total never goes back
    assert got[("radixlm:gen_throughput", "0")] == 0.0 and got[("radixlm:new_token_ratio", "0")] == 0.7
