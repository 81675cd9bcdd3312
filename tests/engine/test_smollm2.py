"""The demo model (SmolLM2-135M-Instruct, dequantised from its Q4_1 GGUF): greedy tokens equal
transformers' on the same converted weights, with a cached follow-up and a chunked prefill."""

from __future__ import annotations

import pytest

from radixlm.srt.engine import Engine
from radixlm.srt.model_loader import ModelLoadError, resolve_model_path
from tests.engine.reference import hf_greedy

MAX_NEW = 12


@pytest.fixture(scope="module")
def smollm2_path():
    try:
        return resolve_model_path(None)
    except ModelLoadError as e:
        pytest.fail(f"demo model unavailable: {e}")


def test_smollm2_greedy_equals_hf(smollm2_path):
    engine = Engine(smollm2_path, dtype="float32", max_total_tokens=2048, chunked_prefill_size=16, page_size=4)
    tok = engine.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   tokenize=False, add_generation_prompt=True)
    prompts = [tok.encode(p) for p in ("Once upon a time", "The three primary colors are", chat)]
    expected = hf_greedy(smollm2_path, tuple(map(tuple, prompts)), MAX_NEW)
    sp = {"temperature": 0, "max_new_tokens": MAX_NEW, "min_new_tokens": MAX_NEW}
    outs = engine.generate(input_ids=prompts, sampling_params=sp)
    assert [o["output_ids"] for o in outs] == expected
    assert "Paris" in tok.decode(expected[2])
    again = engine.generate(input_ids=prompts[2], sampling_params=sp)
    assert again["output_ids"] == expected[2]
    assert again["meta_info"]["cached_tokens"] == (len(prompts[2]) - 1) // 4 * 4
    engine.scheduler.kv.check_idle()
