"""Greedy steps with nothing editing the logits read the model's own bf16 logits (no (R, vocab) fp32
copy; managers/tp_worker.py): the tokens and logprobs must be exactly those of the fp32-widened path,
which a zero logit_bias forces (it counts as an edit but changes no value)."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.srt.engine import Engine


@pytest.fixture(scope="module")
def engine(stories_path):
    return Engine(stories_path, dtype="bfloat16", max_total_tokens=4096, max_running_requests=8)


def test_bf16_greedy_reads_raw_logits_and_matches_the_fp32_path(engine, monkeypatch):
    runner = engine.worker.model_runner
    real, seen = runner.forward, []

    def forward(batch, float_logits=True):
        out = real(batch, float_logits=float_logits)
        seen.append((float_logits, out.dtype))
        return out

    monkeypatch.setattr(runner, "forward", forward)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (5, 40, 90, 17)]
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    plain = engine.generate(input_ids=prompts, sampling_params=sp, return_logprob=True, top_logprobs_num=3)
    assert (False, torch.bfloat16) in seen  # the raw path ran
    seen.clear()
    engine.flush_cache()
    biased = engine.generate(input_ids=prompts, sampling_params={**sp, "logit_bias": {"7": 0.0}},
                             return_logprob=True, top_logprobs_num=3)
    assert seen and all(f for f, _ in seen) and {d for _, d in seen} == {torch.float32}  # the fp32 path only
    for a, b in zip(plain, biased):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
        assert a["meta_info"]["output_top_logprobs"] == b["meta_info"]["output_top_logprobs"]
