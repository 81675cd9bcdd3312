"""``--tp-size 2`` on CPU (gloo, two scheduler processes) through the real server: greedy outputs
equal the single-process engine's for stories260K and a random-weight Qwen2 config; SIGTERM leaves
no process behind."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixlm.srt.engine import Engine
from tests.conftest import STORY_PROMPTS

from .helpers import BASE_ARGS, greedy


@pytest.fixture(scope="module")
def qwen2_path(tmp_path_factory, stories_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=512,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.3, tie_word_embeddings=False, architectures=["Qwen2ForCausalLM"])
    torch.manual_seed(99)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.3)
    path = tmp_path_factory.mktemp("qwen2_tp")
    model.save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{stories_path}/{f}", path / f)
    return str(path)


@pytest.mark.parametrize("which", ["stories", "qwen2"])
def test_tp2_server_equals_engine(launch, stories_path, qwen2_path, which):
    path = stories_path if which == "stories" else qwen2_path
    prompts = STORY_PROMPTS[:10]
    sp = greedy(16, min_new_tokens=16)
    engine = Engine(path, dtype="float32", max_total_tokens=4096)
    expected = [o["output_ids"] for o in engine.generate(prompts, sp)]
    server = launch(["--model-path", path, "--tp-size", "2", *BASE_ARGS])
    with server.client() as http:
        outs = http.post("/generate", json={"text": prompts, "sampling_params": sp}).json()
        assert [o["output_ids"] for o in outs] == expected
        info = http.get("/get_server_info").json()
        assert info["tp_size"] == 2
    log = server.log()
    assert "scheduler-tp1" in log
    assert server.stop() == 0
    assert "crashed" not in server.log() and "Traceback" not in server.log()  # a clean SIGTERM is quiet
