"""``--dp-size 2`` through the real server (two scheduler replicas of stories260K, one CPU thread
each): greedy outputs equal the single-replica engine's, natively and on ``/v1``; one
``internal_states`` entry and one ``/metrics`` series per replica; cache_aware keeps a repeated
prefix on one replica and round_robin alternates; aborts, ``/flush_cache`` and ``/health_generate``
reach every replica; a replica that dies takes the server down naming it."""

from __future__ import annotations

import re
import signal
import threading
import time

import httpx
import pytest

from radixlm.srt.engine import Engine
from radixlm.srt.server_args import ServerArgs, ServerArgsError
from tests.conftest import STORY_PROMPTS

from .helpers import BASE_ARGS, ENDLESS_ARGS, endless, greedy, pid_alive

DP_ARGS = ["--dp-size", "2", *BASE_ARGS, *ENDLESS_ARGS]
# A prefix long enough that a prompt sharing it matches > --router-cache-threshold of its tokens.
PREFIX = " ".join(STORY_PROMPTS[3:7])


@pytest.fixture(scope="module")
def dp_server(launch, stories_path):
    return launch(["--model-path", stories_path, *DP_ARGS])


@pytest.fixture(scope="module")
def http(dp_server):
    with dp_server.client() as client:
        yield client


@pytest.fixture(scope="module")
def engine(stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=4096)


def _states(http: httpx.Client) -> list[dict]:
    return http.get("/get_server_info").json()["internal_states"]


def _wait_idle(http: httpx.Client, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        states = _states(http)
        if all(s["num_running_reqs"] == 0 and s["num_waiting_reqs"] == 0 for s in states):
            return states
        assert time.monotonic() < deadline, f"replicas still busy: {states}"
        time.sleep(0.1)


def _flush_and_check_free(http: httpx.Client) -> None:
    _wait_idle(http)
    resp = http.post("/flush_cache")
    assert resp.status_code == 200, resp.text
    for s in _states(http):
        assert s["available_size"] == s["max_total_num_tokens"], s
        assert s["evictable_size"] == 0 and s["protected_size"] == 0, s


def test_replicas_sample_unseeded_requests_from_their_own_streams(http):
    """First in the module, so both replicas' random streams are where they started: with one shared
    seed the same unseeded request pinned to replica 0 and to replica 1 sampled the same text."""
    body = {"text": STORY_PROMPTS[1], "sampling_params": {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True}}
    pairs = []
    for _ in range(3):
        outs = []
        for rank in (0, 1):
            resp = http.post("/generate", json={**body, "data_parallel_rank": rank})
            assert resp.status_code == 200, resp.text
            outs.append(resp.json()["output_ids"])
        pairs.append(outs)
    assert any(a != b for a, b in pairs), pairs


def test_outputs_equal_one_replica_native_and_v1(http, engine):
    prompts = STORY_PROMPTS[:10]
    sp = greedy(16, min_new_tokens=16)
    expected = engine.generate(prompts, sp)
    before = [s["num_routed_reqs"] for s in _states(http)]
    outs = http.post("/generate", json={"text": prompts, "sampling_params": sp}).json()
    assert [o["output_ids"] for o in outs] == [e["output_ids"] for e in expected]
    assert [o["text"] for o in outs] == [e["text"] for e in expected]
    routed = [s["num_routed_reqs"] - b for s, b in zip(_states(http), before)]
    assert sum(routed) == len(prompts) and min(routed) > 0, routed  # both replicas served some
    body = {"model": "default", "prompt": prompts, "max_tokens": 16, "min_tokens": 16, "temperature": 0}
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    choices = sorted(resp.json()["choices"], key=lambda c: c["index"])
    assert [c["text"] for c in choices] == [e["text"] for e in expected]


def test_replicas_have_their_own_process_titles(dp_server):
    titles = [open(f"/proc/{dp_server.child_pid(n)}/cmdline", "rb").read().split(b"\0")[0].decode()
              for n in ("scheduler-dp0", "scheduler-dp1")]
    assert titles == ["radixlm::scheduler_DP0_TP0", "radixlm::scheduler_DP1_TP0"], titles  # ps tells them apart


def test_one_internal_state_and_metrics_series_per_replica(http):
    info = http.get("/get_server_info").json()
    states = info["internal_states"]
    assert info["dp_size"] == 2 and [s["dp_rank"] for s in states] == [0, 1]
    assert info["internal_state"]["max_total_num_tokens"] == sum(s["max_total_num_tokens"] for s in states)
    assert info["max_total_num_tokens"] == info["internal_state"]["max_total_num_tokens"]
    text = http.get("/metrics").text
    for name in ("num_running_reqs", "max_total_num_tokens", "cache_hit_rate", "routed_requests_total", "dp_load"):
        ranks = sorted(re.findall(rf'^radixlm:{name}\{{[^}}]*dp_rank="(\d)"', text, re.M))
        assert ranks == ["0", "1"], (name, ranks)
    routed = {m[0]: float(m[1]) for m in re.findall(r'^radixlm:routed_requests_total\{[^}]*dp_rank="(\d)"[^}]*\} (\S+)',
                                                   text, re.M)}
    assert routed == {"0": states[0]["num_routed_reqs"], "1": states[1]["num_routed_reqs"]}


def test_cache_aware_keeps_a_shared_prefix_on_one_replica(http):
    _flush_and_check_free(http)
    before = _states(http)
    cached = []
    for i in range(4):
        out = http.post("/generate", json={"text": f"{PREFIX} {STORY_PROMPTS[10 + i]}",
                                           "sampling_params": greedy(4)}).json()
        cached.append(out["meta_info"]["cached_tokens"])
    after = _states(http)
    routed = [a["num_routed_reqs"] - b["num_routed_reqs"] for a, b in zip(after, before)]
    assert sorted(routed) == [0, 4], routed
    hot = routed.index(4)
    assert cached[0] == 0 and all(c > 20 for c in cached[1:]), cached
    assert after[hot]["num_cached_tokens"] - before[hot]["num_cached_tokens"] == sum(cached)
    assert after[1 - hot]["num_cached_tokens"] == before[1 - hot]["num_cached_tokens"]


def test_data_parallel_rank_pins_the_replica(http):
    before = _states(http)
    for rank in (1, 1, 0):
        resp = http.post("/generate", json={"text": STORY_PROMPTS[0], "sampling_params": greedy(2),
                                            "data_parallel_rank": rank})
        assert resp.status_code == 200, resp.text
    after = _states(http)
    assert [a["num_routed_reqs"] - b["num_routed_reqs"] for a, b in zip(after, before)] == [1, 2]
    resp = http.post("/generate", json={"text": "x", "data_parallel_rank": 2})
    assert resp.status_code == 400 and "data_parallel_rank must be in [0, 2)" in resp.json()["error"]["message"]


def test_health_generate_reaches_every_replica(http):
    before = _states(http)
    assert http.get("/health_generate").status_code == 200
    after = _states(http)
    assert [a["num_routed_reqs"] - b["num_routed_reqs"] for a, b in zip(after, before)] == [1, 1]
    assert all(a["num_prompt_tokens"] - b["num_prompt_tokens"] == 1 for a, b in zip(after, before))


def test_abort_flush_and_idle_invariant_across_replicas(http, dp_server):
    """Two endless requests, one per replica: an exact abort ends only its own (one finish_reason
    abort), a busy replica makes /flush_cache fail naming it, abort_all ends the rest, then both pools
    flush back to free (the schedulers' idle leak check runs on the way)."""
    results: dict[str, dict] = {}

    def run(rid: str, rank: int) -> None:
        body = {"text": STORY_PROMPTS[rank], "rid": rid, "sampling_params": endless(), "data_parallel_rank": rank}
        with httpx.Client(base_url=dp_server.url, timeout=300) as c:
            results[rid] = c.post("/generate", json=body).json()

    threads = [threading.Thread(target=run, args=(f"dp-abort-{r}", r)) for r in (0, 1)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all(s["num_running_reqs"] == 1 for s in _states(http)):
        assert time.monotonic() < deadline, _states(http)
        time.sleep(0.05)
    assert http.post("/abort_request", json={"rid": "dp-abort-1"}).status_code == 200
    threads[1].join(30)
    assert results["dp-abort-1"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert "dp-abort-0" not in results
    resp = http.post("/flush_cache")
    assert resp.status_code == 400 and "replica 0" in resp.json()["error"]["message"], resp.text
    assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
    threads[0].join(30)
    assert results["dp-abort-0"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert [s["load"] for s in _wait_idle(http)] == [0, 0]
    _flush_and_check_free(http)
    assert "leak detected" not in dp_server.log()


def test_engine_refuses_dp_and_flags_are_checked():
    with pytest.raises(ServerArgsError, match="need the server"):
        Engine(None, dtype="float32", dp_size=2)
    for bad in ({"dp_size": 0}, {"load_balance_method": "random"}, {"router_cache_threshold": 1.5},
                {"router_balance_rel_threshold": 0.5}, {"router_max_tree_size": 0}):
        with pytest.raises(ServerArgsError):
            ServerArgs.from_kwargs(**bad)


# ---- round_robin, and a replica that dies ---------------------------------------------------------
@pytest.fixture(scope="module")
def rr_server(launch, stories_path):
    return launch(["--model-path", stories_path, "--dp-size", "2", "--load-balance-method", "round_robin",
                   *BASE_ARGS])


def test_round_robin_alternates_and_scatters_the_prefix(rr_server):
    with rr_server.client() as http:
        routed, cached = [], []
        for i in range(4):
            before = [s["num_routed_reqs"] for s in _states(http)]
            out = http.post("/generate", json={"text": f"{PREFIX} {STORY_PROMPTS[10 + i]}",
                                               "sampling_params": greedy(4)}).json()
            after = [s["num_routed_reqs"] for s in _states(http)]
            routed.append([a - b for a, b in zip(after, before)].index(1))
            cached.append(out["meta_info"]["cached_tokens"])
        assert routed in ([0, 1, 0, 1], [1, 0, 1, 0]), routed
        # each replica computes the prefix once: the first visit to each misses
        assert cached[0] == 0 and cached[1] == 0 and cached[2] > 20 and cached[3] > 20, cached


def test_a_dying_replica_stops_the_server_naming_it(rr_server):
    pid = rr_server.child_pid("scheduler-dp1")
    import os

    os.kill(pid, signal.SIGKILL)
    assert rr_server.wait_exit(30) == 1
    log = rr_server.log()
    assert "the scheduler-dp1 process died" in log, log[-3000:]
    assert not pid_alive(rr_server.child_pid("scheduler-dp0"))
