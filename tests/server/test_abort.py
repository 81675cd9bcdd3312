"""Aborts: clients that disconnect, /abort_request by rid prefix and abort_all; the KV pool ends free."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from .helpers import BASE_ARGS, ENDLESS_ARGS, endless, greedy, wait_idle

LONG = endless()  # only an abort ends it in a test's time, whatever the CPU


@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS, "--max-running-requests", "8"])


def _state(http: httpx.Client) -> dict:
    return http.get("/get_server_info").json()["internal_states"][0]


def _wait_for(predicate, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _assert_pool_free_after_flush(http: httpx.Client) -> None:
    wait_idle(http, timeout_s=5.0)
    resp = http.post("/flush_cache")
    assert resp.status_code == 200, resp.text
    state = _state(http)
    assert state["available_size"] == state["max_total_num_tokens"], state
    assert state["evictable_size"] == 0 and state["protected_size"] == 0


def _aborted(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("radixlm:num_aborted_requests_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no abort counter in /metrics")


def test_disconnected_streams_are_aborted_and_kv_freed(http, server):
    aborted_before = _aborted(http)

    async def stream_until_cancelled(client: httpx.AsyncClient, i: int, got_event: asyncio.Event) -> None:
        body = {"text": f"Once upon a time {i}", "sampling_params": LONG, "stream": True}
        async with client.stream("POST", "/generate", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    got_event.set()

    async def main() -> float:
        async with httpx.AsyncClient(base_url=server.url, timeout=None,
                                     limits=httpx.Limits(max_connections=32)) as client:
            streaming = asyncio.Event()
            tasks = [asyncio.create_task(stream_until_cancelled(client, i, streaming)) for i in range(16)]
            # 8 run and stream, 8 wait in the queue (--max-running-requests 8).
            await asyncio.wait_for(streaming.wait(), 60)
            def all_admitted() -> bool:
                s = _state(http)
                return s["num_running_reqs"] == 8 and s["num_waiting_reqs"] == 8

            await asyncio.to_thread(_wait_for, all_admitted, 60.0, "16 requests")
            for task in tasks:
                task.cancel()  # closes each connection mid-stream
            await asyncio.gather(*tasks, return_exceptions=True)
            return time.monotonic()

    closed_at = asyncio.run(main())
    _wait_for(lambda: (lambda s: s["num_running_reqs"] + s["num_waiting_reqs"] == 0)(_state(http)), 5.0, "aborts")
    assert time.monotonic() - closed_at < 5.0
    _assert_pool_free_after_flush(http)
    assert _aborted(http) - aborted_before == 16
    assert "aborting request" in server.log()


def test_disconnected_non_streaming_request_is_aborted(http, server):
    with pytest.raises(httpx.ReadTimeout):
        with server.client(timeout=1.5) as short:
            short.post("/generate", json={"text": "Lily", "sampling_params": LONG})
    _wait_for(lambda: _state(http)["num_running_reqs"] == 0, 5.0, "the abort")
    _assert_pool_free_after_flush(http)


def _post_in_threads(server, bodies: list[dict]) -> tuple[list[threading.Thread], list]:
    results: list = [None] * len(bodies)

    def run(i: int) -> None:
        with server.client() as c:
            results[i] = c.post("/generate", json=bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    return threads, results


def test_abort_all_ends_running_and_queued_requests(http, server):
    threads, results = _post_in_threads(server, [{"text": f"Lily {i}", "sampling_params": LONG} for i in range(12)])
    _wait_for(lambda: (lambda s: s["num_running_reqs"] == 8 and s["num_waiting_reqs"] == 4)(_state(http)),
              60.0, "8 running + 4 queued")
    assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
    for t in threads:
        t.join(10)
    assert all(r is not None and r.status_code == 200 for r in results)
    reasons = [r.json()["meta_info"]["finish_reason"] for r in results]
    assert all(fr["type"] == "abort" for fr in reasons), reasons
    assert sum(fr["message"] == "Abort in waiting queue" for fr in reasons) == 4
    _assert_pool_free_after_flush(http)


def test_abort_by_rid_prefix(http, server):
    bodies = [{"text": "Lily", "rid": "drop-a", "sampling_params": LONG},
              {"text": "Lily", "rid": "drop-b", "sampling_params": LONG},
              # long enough to be seen running by the 50 ms poll on a fast CPU (40 tokens were not)
              {"text": "Lily", "rid": "keep", "sampling_params": greedy(600, ignore_eos=True)}]
    threads, results = _post_in_threads(server, bodies)
    _wait_for(lambda: _state(http)["num_running_reqs"] == 3, 60.0, "3 running")
    assert http.post("/abort_request", json={"rid": "drop"}).status_code == 200
    for t in threads:
        t.join(60)
    by_rid = {r.json()["meta_info"]["id"]: r.json()["meta_info"]["finish_reason"] for r in results}
    assert by_rid["drop-a"]["type"] == by_rid["drop-b"]["type"] == "abort"
    assert by_rid["keep"] == {"type": "length", "length": 600}
    _assert_pool_free_after_flush(http)


def test_abort_reaches_a_queued_n_copies_request(http, server):
    """An n > 1 request still queued (its warm-up prefill waiting) is aborted whole: the warm-up ends
    with abort and its n copies end with the same reason without being sent (a newcomer's finding:
    the copies were sent after the abort and ran to their end)."""
    fillers = [{"text": f"Lily {i}", "sampling_params": LONG} for i in range(8)]
    target = {"text": "Once upon a time", "rid": "target",
              "sampling_params": {**LONG, "n": 2}}
    other = {"text": ["Lily", "Tom"], "rid": ["zap", "stay"],
             "sampling_params": greedy(8, ignore_eos=True, n=2)}
    threads, results = _post_in_threads(server, fillers)
    _wait_for(lambda: _state(http)["num_running_reqs"] == 8, 60.0, "8 running")
    (t_target, t_other), pair = _post_in_threads(server, [target, other])
    _wait_for(lambda: _state(http)["num_waiting_reqs"] == 3, 60.0, "3 queued warm-ups")
    assert http.post("/abort_request", json={"rid": "zap"}).status_code == 200  # one prompt of the batch
    assert http.post("/abort_request", json={"rid": "target"}).status_code == 200
    t_target.join(10)
    assert not t_target.is_alive(), "the aborted n=2 request did not end"
    copies = pair[0].json()
    assert pair[0].status_code == 200 and len(copies) == 2
    for c in copies:
        assert c["meta_info"]["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
        assert c["output_ids"] == [] and c["meta_info"]["completion_tokens"] == 0
        assert c["meta_info"]["prompt_tokens"] > 0
    assert http.post("/abort_request", json={"abort_all": True}).status_code == 200  # the fillers
    for t in [*threads, t_other]:
        t.join(60)
    batch = pair[1].json()
    assert [o["meta_info"]["finish_reason"]["type"] for o in batch[:2]] == ["abort", "abort"]  # zap's copies
    assert all(o["output_ids"] == [] for o in batch[:2])
    assert all(o["meta_info"]["finish_reason"]["type"] in ("length", "abort") for o in batch[2:])  # stay's ran
    _assert_pool_free_after_flush(http)
