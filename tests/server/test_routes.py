"""Native routes besides /generate, and a replay of SGLang's RuntimeEndpoint request shapes."""

from __future__ import annotations

import threading
import time

from tests.conftest import STORY_PROMPTS

from .helpers import assert_pool_free_after_flush, endless, greedy, wait_idle


def test_health_and_health_generate(http):
    assert http.get("/health").status_code == 200
    assert http.head("/health").status_code == 200
    assert http.get("/health_generate").status_code == 200


READ_ONLY_ROUTES = ["/health", "/health_generate", "/get_model_info", "/model_info", "/get_server_info", "/server_info",
                    "/get_load", "/metrics", "/v1/models"]


def test_read_only_routes_answer_head_like_get_without_a_body(http, stories_path):
    """HEAD (load balancers', uptime checkers' and curl -I's probe) runs the GET handler: its status and
    headers, no body (issue: a 405 everywhere but /health)."""
    for path in [*READ_ONLY_ROUTES, f"/v1/models/{stories_path}"]:
        get, head = http.get(path), http.head(path)
        assert (get.status_code, head.status_code) == (200, 200), (path, head.status_code, head.text)
        assert head.content == b"", path
        assert head.headers.get("content-type") == get.headers.get("content-type"), path
    for path in ("/get_model_info", "/v1/models", f"/v1/models/{stories_path}"):  # the same answer every time
        assert int(http.head(path).headers["content-length"]) == len(http.get(path).content) > 0, path
    missing = http.head("/v1/models/another-model")
    assert missing.status_code == 404 and missing.content == b""
    assert http.head("/generate").status_code == 405  # not a read-only route
    assert_pool_free_after_flush(http)  # HEAD /health_generate's request left nothing behind


def test_model_info_and_alias(http, stories_path):
    info = http.get("/get_model_info").json()
    assert info == http.get("/model_info").json()
    assert info["model_path"] == stories_path and info["tokenizer_path"] == stories_path
    assert info["is_generation"] is True
    assert info["architectures"] == ["LlamaForCausalLM"] and info["context_length"] == 2048


def test_server_info_has_every_server_arg(http):
    from radixlm import __version__
    from radixlm.srt.server_args import ServerArgs

    info = http.get("/get_server_info").json()
    assert info.keys() == http.get("/server_info").json().keys()
    fields = set(ServerArgs.__dataclass_fields__) - {"api_key"}
    assert fields <= info.keys() and "api_key" not in info
    assert info["max_total_tokens"] == 40000 and info["max_total_num_tokens"] == 40000
    assert info["version"] == __version__
    from radixlm.srt.cpu_runtime import cpu_info

    here = cpu_info()
    # the test servers run the fp32 oracle (--dtype float32); auto's choice per CPU: test_cpu_runtime.py
    assert info["dtype"] == "float32" and info["model_dtype"] == "float32"
    assert info["cpu"] == here.to_json() and info["cpu"]["cores"] >= 1
    state = info["internal_states"][0]
    assert state["max_total_num_tokens"] == 40000 and state["context_len"] == 2048
    from radixlm.kernels.gemm.onednn import onednn_supports

    # --attention-backend / --gemm-backend auto, resolved on this CPU
    assert info["attention_backend"] == "auto" and info["gemm_backend"] == "auto"
    from radixlm.kernels.cpu_extension import cpu_kernels_error

    assert state["attention_backend"] == ("cpu" if cpu_kernels_error() is None else "torch_native")
    assert state["elementwise_backend"] == state["attention_backend"]  # both: the C++ kernels where they build
    import torch

    dtype = getattr(torch, info["model_dtype"])
    if dtype == torch.float32 and cpu_kernels_error() is None:
        assert state["gemm_backend"] == "cpu"  # the packed-panel C++ GEMM
    else:
        assert state["gemm_backend"] == ("onednn" if onednn_supports(dtype) else "torch_native")


def test_flush_cache_frees_the_pool_and_is_refused_while_busy(endless_server):
    server = endless_server
    with server.client() as http:
        _flush_while_busy(server, http)


def _flush_while_busy(server, http) -> None:
    http.post("/generate", json={"text": STORY_PROMPTS[0], "sampling_params": greedy(4)})
    before = wait_idle(http)
    assert before["evictable_size"] > 0
    resp = http.post("/flush_cache")
    assert resp.status_code == 200
    after = http.get("/get_server_info").json()["internal_states"][0]
    assert after["available_size"] == after["max_total_num_tokens"] and after["evictable_size"] == 0

    done = threading.Event()
    result = {}

    def long_request() -> None:
        with server.client() as c:
            result["r"] = c.post("/generate", json={"text": "Lily", "sampling_params": endless()})
        done.set()

    worker = threading.Thread(target=long_request)
    worker.start()
    deadline = time.monotonic() + 30
    while http.get("/get_server_info").json()["internal_states"][0]["num_running_reqs"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    refused = http.post("/flush_cache")
    assert refused.status_code == 400
    assert "running" in refused.json()["error"]["message"]
    assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
    worker.join(30)
    assert done.is_set() and result["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(http)
    assert http.get("/flush_cache").status_code == 200


def test_metrics_count_tokens(http):
    def sample(text: str, name: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} missing from /metrics:\n{text}")

    before = http.get("/metrics")
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain")
    gen0 = sample(before.text, "radixlm:generation_tokens_total")
    prompt0 = sample(before.text, "radixlm:prompt_tokens_total")
    body = http.post("/generate", json={"text": STORY_PROMPTS[1], "sampling_params": greedy(5)}).json()
    after = http.get("/metrics").text
    assert sample(after, "radixlm:generation_tokens_total") == gen0 + 5
    assert sample(after, "radixlm:prompt_tokens_total") == prompt0 + body["meta_info"]["prompt_tokens"]
    for name in ("radixlm:cached_tokens_total", "radixlm:cache_hit_rate", "radixlm:num_running_reqs",
                 "radixlm:num_queued_reqs", "radixlm:token_usage", "radixlm:time_to_first_token_seconds_count",
                 "radixlm:inter_token_latency_seconds_count", "radixlm:gen_throughput", "radixlm:new_token_ratio",
                 "radixlm:num_retracted_reqs_total", "radixlm:grammar_compiles_total"):
        sample(after, name)


def test_abort_request_needs_a_rid_or_abort_all(http):
    resp = http.post("/abort_request", json={})
    assert resp.status_code == 400 and "rid" in resp.json()["error"]["message"]
    assert http.post("/abort_request", json={"rid": "no-such-request"}).status_code == 200


# ---- SGLang's RuntimeEndpoint, as observed on the wire ------------------------------------------------
def _sglang_sampling_params(**set_fields) -> dict:
    """Every field SGLang's frontend sends, unset ones as null (top_k -1 = whole vocabulary)."""
    params = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 128,
              "min_new_tokens": None, "n": None, "stop": None, "stop_token_ids": None, "stop_regex": None,
              "temperature": None, "top_p": None, "top_k": -1, "min_p": None, "frequency_penalty": None,
              "presence_penalty": None, "ignore_eos": None, "regex": None, "json_schema": None}
    params.update(set_fields)
    return params


def test_runtime_endpoint_replay(http):
    info = http.get("/get_model_info").json()
    assert {"model_path", "is_generation"} <= info.keys()

    # gen: the whole program text, every sampling field present.
    gen = http.post("/generate", json={"text": "Once upon a time",
                                       "sampling_params": _sglang_sampling_params(max_new_tokens=12, temperature=0)})
    assert gen.status_code == 200, gen.text
    assert gen.json()["text"].startswith(", there was a little girl")

    # select: cache the prefix, then score the choices with input logprobs.
    prefix = "Once upon a time, there was a little"
    cached = http.post("/generate", json={"text": prefix, "sampling_params": {"max_new_tokens": 0}}).json()
    prompt_len = cached["meta_info"]["prompt_tokens"]
    choices = [" girl", " dog", " boy"]
    scored = http.post("/generate", json={
        "text": [prefix + c for c in choices], "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": max(prompt_len - 2, 0)})
    assert scored.status_code == 200, scored.text
    results = scored.json()
    assert len(results) == 3
    for r in results:
        meta = r["meta_info"]
        lps = meta["input_token_logprobs"]
        assert len(lps) == meta["prompt_tokens"] - (prompt_len - 2)
        assert all(len(t) == 3 and (t[0] is None or t[0] <= 0) and isinstance(t[1], int) and isinstance(t[2], str)
                   for t in lps)
        assert meta["cached_tokens"] >= prompt_len - 2 - 1  # the prefix came from the cache
    means = [sum(t[0] for t in r["meta_info"]["input_token_logprobs"] if t[0] is not None) /
             len(r["meta_info"]["input_token_logprobs"]) for r in results]
    assert max(range(3), key=means.__getitem__) == 0  # "girl" is what the model says next

    # the unconditional call: input_ids of the choice only, logprob_start_len 0
    uncond = http.post("/generate", json={"input_ids": [[403, 407], [385]], "sampling_params": {"max_new_tokens": 0},
                                          "return_logprob": True, "logprob_start_len": 0}).json()
    assert [len(u["meta_info"]["input_token_logprobs"]) for u in uncond] == [2, 1]
    assert uncond[0]["meta_info"]["input_token_logprobs"][0][0] is None

    assert http.post("/flush_cache").status_code == 200
    server_info = http.get("/server_info").json()
    assert "max_total_num_tokens" in server_info and "version" in server_info
    assert http.get("/model_info").json() == info


def test_model_info_reports_chat_template(server, http):
    info = http.get("/get_model_info").json()
    assert "chat_template" in info  # stories260K has none: null
    assert info["chat_template"] is None


def test_scheduler_runs_with_a_bounded_openmp_spin(server):
    """The launcher gives the scheduler OMP_WAIT_POLICY=ACTIVE with GOMP_SPINCOUNT=10000 (unless the user
    set a policy): no futex wake-up per parallel region, no long spin on a busy machine
    (radixlm.srt.cpu_runtime)."""
    import os

    env = open(f"/proc/{server.child_pid('scheduler')}/environ", "rb").read().split(b"\0")
    if os.environ.get("OMP_WAIT_POLICY"):
        assert b"OMP_WAIT_POLICY=" + os.environ["OMP_WAIT_POLICY"].encode() in env
    else:
        assert b"OMP_WAIT_POLICY=ACTIVE" in env
        assert b"GOMP_SPINCOUNT=" + os.environ.get("GOMP_SPINCOUNT", "10000").encode() in env
