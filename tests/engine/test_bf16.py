"""bfloat16 numerics (the dtype ``--dtype auto`` picks on CPUs with AMX-BF16/AVX512-BF16).

- Greedy output does not depend on batching, chunked prefill, page size or radix-cache hits: every
  variant equals the same prompts run one at a time.
- Against transformers in bfloat16, greedy tokens agree except at genuine near-ties: at the first
  divergence of a prompt, the top-2 logprob gap is below ``NEAR_TIE`` in one of the two runs. The
  gaps are printed for every divergence (``pytest -s``).
fp32 keeps its exact token-equality suite (test_greedy_vs_hf.py).
"""

from __future__ import annotations

import pytest
import torch

from radixlm.srt.engine import Engine
from tests.engine.test_greedy_vs_hf import assert_clean, prompts_ids  # noqa: F401 (a fixture)

MAX_NEW = 24
SP = {"temperature": 0, "max_new_tokens": MAX_NEW, "min_new_tokens": MAX_NEW}
NEAR_TIE = 0.1
VARIANTS = {
    "batch": {},
    "page16": {"page_size": 16},
    "chunk8": {"chunked_prefill_size": 8},
    "no_radix": {"disable_radix_cache": True},
    "retract": {"max_total_tokens": 400, "schedule_conservativeness": 0.3},
}


@pytest.fixture(scope="module")
def solo(stories_path, prompts_ids):
    engine = Engine(stories_path, dtype="bfloat16", max_total_tokens=8192)
    assert engine.model_config.dtype == torch.bfloat16
    return [engine.generate(input_ids=ids, sampling_params=SP)["output_ids"] for ids in prompts_ids]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bf16_greedy_does_not_depend_on_batching_or_caching(stories_path, prompts_ids, solo, variant):
    kw = {"max_total_tokens": 8192, **VARIANTS[variant]}
    engine = Engine(stories_path, dtype="bfloat16", **kw)
    first = [o["output_ids"] for o in engine.generate(input_ids=prompts_ids, sampling_params=SP)]
    assert first == solo
    if variant == "retract":
        assert engine.scheduler.stats["retractions"] > 0
    if not kw.get("disable_radix_cache"):
        again = [o["output_ids"] for o in engine.generate(input_ids=prompts_ids, sampling_params=SP)]
        assert again == solo  # served from the radix cache
    assert_clean(engine)


def _top2_gap(logprobs_row: torch.Tensor) -> float:
    top = torch.topk(logprobs_row.float(), 2).values
    return float(top[0] - top[1])


def first_divergence(engine: Engine, hf, ids: list[int], ours: list[int], ref: list[int]):
    """Where greedy ``ours`` first leaves transformers' ``ref`` after prompt ``ids``: (position k, our
    top-2 logprob gap there, transformers' gap, transformers' logits (V,) there)."""
    k = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
    with torch.no_grad():
        hf_logits = hf(torch.tensor([ids + ref[:k]])).logits[0, -1].float()
    out = engine.generate(input_ids=ids + ours[:k], sampling_params={"temperature": 0, "max_new_tokens": 1},
                          return_logprob=True, top_logprobs_num=2)
    top = out["meta_info"]["output_top_logprobs"][0]
    return k, float(top[0][0] - top[1][0]), _top2_gap(torch.log_softmax(hf_logits, -1)), hf_logits


def test_bf16_matches_transformers_up_to_near_ties(stories_path, prompts_ids, solo):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.bfloat16).eval()
    engine = Engine(stories_path, dtype="bfloat16", max_total_tokens=8192)
    divergences = 0
    for ids, ours in zip(prompts_ids, solo):
        x = torch.tensor([ids])
        with torch.no_grad():
            ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW,
                              do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
        if ours == ref:
            continue
        divergences += 1
        k, our_gap, hf_gap, _ = first_divergence(engine, hf, ids, ours, ref)
        print(f"divergence at output {k}: ours {ours[k]} (gap {our_gap:.4f}) vs transformers {ref[k]} "
              f"(gap {hf_gap:.4f})")
        assert min(our_gap, hf_gap) < NEAR_TIE, (k, our_gap, hf_gap)
    print(f"{divergences} of {len(solo)} prompts diverge from transformers bf16, all at near-ties")


def test_bf16_cpu_kernel_output_does_not_depend_on_batching_or_caching(stories_path, prompts_ids):
    """The C++ attention kernel computes a token the same way in prefill, chunk and decode: bf16
    greedy output of a batch, with chunked prefill and a second (cached) pass, equals one at a time."""
    from radixlm.kernels.cpu_extension import cpu_kernels_error

    if cpu_kernels_error() is not None:
        pytest.skip(cpu_kernels_error())
    solo_engine = Engine(stories_path, dtype="bfloat16", max_total_tokens=8192, attention_backend="cpu")
    alone = [solo_engine.generate(input_ids=ids, sampling_params=SP)["output_ids"] for ids in prompts_ids]
    engine = Engine(stories_path, dtype="bfloat16", max_total_tokens=8192, attention_backend="cpu",
                    chunked_prefill_size=8, page_size=4)
    for _ in range(2):  # the second pass is served from the radix cache
        assert [o["output_ids"] for o in engine.generate(input_ids=prompts_ids, sampling_params=SP)] == alone
    assert_clean(engine)
