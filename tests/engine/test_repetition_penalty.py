"""repetition_penalty (SGLang / vLLM / HF sampling param): greedy tokens equal transformers'
``generate(repetition_penalty=...)`` on the same weights (fp32, one prompt at a time), in a batch,
with chunked prefill and the radix cache, and with speculative decoding; the penalty counts prompt
tokens as well as output tokens, and 1.0 changes nothing."""

from __future__ import annotations

import pytest

from radixlm.srt.engine import Engine
from tests.conftest import STORY_PROMPTS
from tests.engine.reference import hf_greedy

MAX_NEW = 20


@pytest.fixture(scope="module")
def prompts_ids(stories_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(stories_path)
    return [tok.encode(p) for p in STORY_PROMPTS[:5]]


def _sp(penalty: float) -> dict:
    return {"temperature": 0, "max_new_tokens": MAX_NEW, "min_new_tokens": MAX_NEW, "repetition_penalty": penalty}


@pytest.mark.parametrize("penalty", [1.3, 0.8])
@pytest.mark.parametrize("variant", [{}, {"chunked_prefill_size": 8, "page_size": 4},
                                     {"speculative_algorithm": "NGRAM"}])
def test_greedy_with_repetition_penalty_equals_transformers(stories_path, prompts_ids, penalty, variant):
    expected = hf_greedy(stories_path, tuple(map(tuple, prompts_ids)), MAX_NEW, penalty)
    plain = hf_greedy(stories_path, tuple(map(tuple, prompts_ids)), MAX_NEW)
    assert expected != plain, "the penalty must change the reference, or this test checks nothing"
    engine = Engine(stories_path, dtype="float32", max_total_tokens=4096, **variant)
    batch = engine.generate(input_ids=prompts_ids, sampling_params=_sp(penalty))
    assert [o["output_ids"] for o in batch] == expected
    again = engine.generate(input_ids=prompts_ids[1], sampling_params=_sp(penalty))  # prefix cached now
    assert again["output_ids"] == expected[1]
    assert [o["output_ids"] for o in engine.generate(input_ids=prompts_ids, sampling_params=_sp(1.0))] == plain
    engine.scheduler.kv.check_idle()
    engine.shutdown()


def test_prompt_tokens_count_as_seen(stories_path):
    """At the first step there is no output yet: the penalty acts through the prompt's tokens alone
    (HF's processor and vLLM see the prompt). Story prompt 3's greedy first token is one of its own
    tokens, which a penalty of 1.3 demotes."""
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(stories_path).encode(STORY_PROMPTS[3])
    plain, penalised = (hf_greedy(stories_path, (tuple(prompt),), 1, p)[0][0] for p in (1.0, 1.3))
    assert plain in prompt and plain != penalised
    engine = Engine(stories_path, dtype="float32", max_total_tokens=2048)
    first = [engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 1,
                                                                "repetition_penalty": p})["output_ids"][0]
             for p in (1.0, 1.3)]
    assert first == [plain, penalised]
    # logprobs stay the model's own (raw logits), not the penalised ones
    import torch

    from tests.engine.reference import hf_logits

    out = engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 1,
                                                             "repetition_penalty": 1.3}, return_logprob=True)
    lp, tid, _ = out["meta_info"]["output_token_logprobs"][0]
    assert tid == penalised
    assert abs(lp - float(torch.log_softmax(hf_logits(stories_path, prompt)[-1], -1)[penalised])) < 1e-4
    engine.shutdown()
