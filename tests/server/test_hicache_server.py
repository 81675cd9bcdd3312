"""A server with the hierarchical cache: meta_info.cached_tokens_details, /v1 usage details, per-tier
metrics, /flush_cache (device + host) and /clear_hicache_storage_backend (storage)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import STORY_PROMPTS

from .helpers import BASE_ARGS, greedy, wait_idle

# Eight prompts of ~25-45 tokens with 8 new tokens each against a 96-token pool: by the second
# round the radix tree alone has forgotten every one of them.
PROMPTS = [f"Once upon a time, {STORY_PROMPTS[i]}" for i in (3, 6, 9, 11, 13, 17, 12, 14)]


@pytest.fixture(scope="module")
def hicache_server(launch, stories_path, tmp_path_factory):
    storage = tmp_path_factory.mktemp("hicache-storage")
    args = [a for a in BASE_ARGS]
    args[args.index("--max-total-tokens") + 1] = "96"
    return launch(["--model-path", stories_path, *args, "--page-size", "4", "--dtype", "float32",
                   "--enable-hierarchical-cache", "--hicache-ratio", "8", "--hicache-storage-backend", "file",
                   "--hicache-storage-dir", str(storage), "--served-model-name", "stories260k"])


@pytest.fixture(scope="module")
def client(hicache_server):
    with hicache_server.client() as c:
        yield c


def generate(client, text: str) -> dict:
    r = client.post("/generate", json={"text": text, "sampling_params": greedy(8)})
    assert r.status_code == 200, r.text
    return r.json()


def test_second_round_is_served_from_host_and_identical(client):
    first = [generate(client, p) for p in PROMPTS]
    second = [generate(client, p) for p in PROMPTS]
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in second]
    for out in second:
        meta = out["meta_info"]
        d = meta["cached_tokens_details"]
        assert set(d) == {"device", "host", "storage"} and sum(d.values()) == meta["cached_tokens"]
        assert meta["cached_tokens"] == (meta["prompt_tokens"] - 1) // 4 * 4
        # Only the shared opening ("Once upon a time," = 2 pages) is still in the device pool.
        assert d["device"] <= 8 and d["host"] > 0, d
    assert sum(o["meta_info"]["cached_tokens_details"]["host"] for o in second) > \
        3 * sum(o["meta_info"]["cached_tokens_details"]["device"] for o in second)
    state = wait_idle(client)
    assert state["hicache"]["cached_tokens_host"] >= sum(o["meta_info"]["cached_tokens_details"]["host"] for o in second)


def test_v1_usage_has_tier_details(client):
    body = {"model": "stories260k", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
    for _ in range(2):
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
    details = r.json()["usage"]["prompt_tokens_details"]
    assert set(details["cached_tokens_details"]) == {"device", "host", "storage"}
    assert sum(details["cached_tokens_details"].values()) == details["cached_tokens"] > 0


def _metric(text: str, name: str, tier: str | None = None) -> float:
    label = f'.*tier="{tier}"' if tier else ""
    m = re.search(rf"^radixlm:{name}\{{[^}}]*{label}[^}}]*\}} (\S+)$", text, re.M)
    assert m is not None, f"{name} {tier} missing"
    return float(m.group(1))


def test_metrics_per_tier_then_flushes(client):
    generate(client, PROMPTS[1])
    generate(client, PROMPTS[1])
    text = client.get("/metrics").text
    assert _metric(text, "cached_tokens_by_tier", "host") > 0
    assert _metric(text, "cached_tokens_by_tier", "device") >= 0
    assert _metric(text, "hicache_host_capacity_tokens") == 96 * 8
    assert _metric(text, "hicache_host_used_tokens") > 0
    assert _metric(text, "hicache_storage_files") > 0 and _metric(text, "hicache_storage_bytes") > 0
    # /flush_cache: device and host; storage stays and serves the next visit.
    assert client.post("/flush_cache").status_code == 200
    state = wait_idle(client)
    assert state["hicache"]["host_used_tokens"] == 0 and state["evictable_size"] == 0
    again = generate(client, PROMPTS[1])["meta_info"]
    assert again["cached_tokens_details"]["storage"] == again["cached_tokens"] > 0
    # The storage tier's own flush.
    r = client.post("/clear_hicache_storage_backend")
    assert r.status_code == 200 and "deleted" in r.text
    assert client.post("/flush_cache").status_code == 200
    assert wait_idle(client)["hicache"]["storage_files"] == 0
    assert generate(client, PROMPTS[1])["meta_info"]["cached_tokens"] == 0
