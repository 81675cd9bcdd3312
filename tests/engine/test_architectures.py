"""Random-weight Llama (llama3 RoPE scaling, tied embeddings), Qwen2 (qkv bias) and Qwen3 (q/k norm)
built in memory: the engine's greedy tokens equal transformers' on the same weights."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixlm.srt.engine import Engine
from tests.engine.reference import hf_greedy

MAX_NEW = 16


def _configs():
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=512,
                  max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.3)
    return {
        "llama3_tied": LlamaConfig(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64}, **common),
        "qwen2": Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, **common),
        "qwen3": Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                             **common),
    }


@pytest.fixture(scope="module", params=["llama3_tied", "qwen2", "qwen3"])
def random_model(request, tmp_path_factory, stories_path):
    from transformers import AutoModelForCausalLM

    cfg = _configs()[request.param]
    cfg.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                          "qwen3": "Qwen3ForCausalLM"}[cfg.model_type]]
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if request.param == "qwen2":  # make the biases matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.3)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{stories_path}/{f}", path / f)
    return str(path)


def test_random_weights_match_hf(random_model):
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (1, 3, 7, 12, 20, 33, 50, 64)]
    expected = hf_greedy(random_model, tuple(map(tuple, prompts)), MAX_NEW)
    engine = Engine(random_model, dtype="float32", max_total_tokens=2048, chunked_prefill_size=16, page_size=4)
    sp = {"temperature": 0, "max_new_tokens": MAX_NEW, "min_new_tokens": MAX_NEW}
    outs = engine.generate(input_ids=prompts, sampling_params=sp)
    assert [o["output_ids"] for o in outs] == expected
    engine.scheduler.kv.check_idle()
