"""A server with weights kept quantized: ``--quantization int8`` and a GGUF model's own blocks (the
default for a .gguf path) serve greedy output equal to the offline Engine with the same setting,
/get_server_info reports the quantization, and streamed output equals unstreamed."""

from __future__ import annotations

import pytest

from radixlm.kernels.cpu_extension import cpu_kernels_error
from radixlm.srt.engine import Engine
from tests.conftest import STORIES_GGUF, STORY_PROMPTS
from tests.engine.quant_models import STORIES_QUANT_LAYERS, STORIES_QUANT_TYPES, write_quantized_gguf

from .helpers import BASE_ARGS, greedy, sse_events, wait_idle

pytestmark = pytest.mark.skipif(cpu_kernels_error() is not None, reason=f"no C++ CPU kernels: {cpu_kernels_error()}")


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gguf") / "stories260K-q4.gguf"
    return str(write_quantized_gguf(STORIES_GGUF, path, STORIES_QUANT_TYPES))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("setting", ["gguf-default", "int8"])
def test_quantized_server_matches_the_engine(launch, stories_path, q4_gguf, cache_dir, setting):
    if setting == "int8":
        model, flags, layers = stories_path, ["--quantization", "int8"], {"int8": 16, "dense": 5}
        engine = Engine(stories_path, dtype="float32", max_total_tokens=4096, quantization="int8")
    else:
        model, flags, layers = q4_gguf, ["--cache-dir", cache_dir], STORIES_QUANT_LAYERS
        engine = Engine(q4_gguf, dtype="float32", max_total_tokens=4096, cache_dir=cache_dir)
    server = launch(["--model-path", model, *BASE_ARGS, *flags])
    with server.client() as http:
        info = http.get("/get_server_info").json()
        state = info["internal_states"][0]
        assert state["quantization"] == setting.removesuffix("-default") and state["quantized_layers"] == layers
        for prompt in STORY_PROMPTS[:4]:
            want = engine.generate(prompt, greedy(24, ignore_eos=True))
            got = http.post("/generate", json={"text": prompt, "sampling_params": greedy(24, ignore_eos=True)})
            assert got.status_code == 200, got.text
            assert got.json()["output_ids"] == want["output_ids"] and len(want["output_ids"]) == 24
            assert got.json()["meta_info"]["finish_reason"]["type"] == "length"
            events = sse_events(http, {"text": prompt, "sampling_params": greedy(24, ignore_eos=True), "stream": True})
            assert events[-1] == "[DONE]" and events[-2]["text"] == want["text"]
        assert len(set(engine.generate(STORY_PROMPTS[0], greedy(24))["text"].split())) > 3  # words, not one repeated
        wait_idle(http)
