"""Batch-invariant inference (issue 14, part 4; SGLang's ``--enable-deterministic-inference``): a
request's logprobs are bitwise the same alone, in a batch, with chunked prefill, another page size
and after radix-cache hits. fp32 gets it by default on CPU (every ``auto`` kernel is radixlm's C++
kernel); bf16 with the flag, and by default where ``auto`` takes the C++ GEMM for bf16 too (AVX512-BF16
without AMX, or no bf16 units).

Model: stories260K. Greedy, with the chosen tokens' logprobs compared as exact floats.
"""

from __future__ import annotations

import pytest

from radixlm.kernels.cpu_extension import cpu_kernels_error
from radixlm.srt.engine import Engine
from radixlm.srt.server_args import ServerArgs, ServerArgsError
from tests.conftest import STORY_PROMPTS
from tests.engine.test_greedy_vs_hf import assert_clean

pytestmark = pytest.mark.skipif(cpu_kernels_error() is not None, reason="the C++ CPU kernels are unavailable")

SP = {"temperature": 0, "max_new_tokens": 10, "min_new_tokens": 10}
VARIANTS = {"batch": {}, "chunk8": {"chunked_prefill_size": 8}, "page16_chunk5": {"page_size": 16, "chunked_prefill_size": 5}}


def traces(engine: Engine, prompts: list[str], batched: bool) -> list[tuple[list[int], list[float]]]:
    """(output ids, their logprobs) per prompt; twice over in the batched form (the second pass hits the cache)."""
    def one(out: dict) -> tuple[list[int], list[float]]:
        return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]

    if not batched:
        res = []
        for p in prompts:
            engine.flush_cache()
            res.append(one(engine.generate(p, SP, return_logprob=True)))
        return res
    first = [one(o) for o in engine.generate(prompts, SP, return_logprob=True)]
    second = [one(o) for o in engine.generate(prompts[::-1], SP, return_logprob=True)][::-1]
    assert second == first, "a radix-cache hit changed a logprob"
    return first


def _bf16_auto_is_batch_invariant() -> bool:
    """``auto`` takes the cpu GEMM for bf16 here (AVX512-BF16 without AMX, or no bf16 units)."""
    import torch

    from radixlm.kernels.gemm import create_gemm_backend

    return create_gemm_backend("auto", torch.device("cpu"), torch.bfloat16).name == "cpu"


@pytest.mark.parametrize("dtype,flag", [("float32", False), ("bfloat16", True), ("bfloat16", False)])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logprobs_do_not_depend_on_batch_chunking_or_cache(stories_path, dtype, flag, variant):
    if dtype == "bfloat16" and not flag and not _bf16_auto_is_batch_invariant():
        pytest.skip("bf16 without the flag runs oneDNN's GEMM here (AMX), which depends on the batch")
    kw = {"dtype": dtype, "max_total_tokens": 4096, "enable_deterministic_inference": flag}
    solo = traces(Engine(stories_path, **kw), STORY_PROMPTS[:6], batched=False)
    engine = Engine(stories_path, **kw, **VARIANTS[variant])
    runner = engine.worker.model_runner
    assert (runner.attn_backend.name, runner.gemm_backend.name, runner.elementwise_backend.name) == ("cpu",) * 3
    assert traces(engine, STORY_PROMPTS[:6], batched=True) == solo
    assert_clean(engine)


def test_flag_resolves_auto_and_refuses_other_kernels():
    args = ServerArgs(model_path="m", enable_deterministic_inference=True)
    args.validate()
    assert [args.kernel_backend(k) for k in ("attention", "gemm", "elementwise")] == ["cpu"] * 3
    assert ServerArgs(model_path="m", gemm_backend="onednn").kernel_backend("gemm") == "onednn"
    with pytest.raises(ServerArgsError, match="needs --gemm-backend cpu"):
        ServerArgs(model_path="m", enable_deterministic_inference=True, gemm_backend="onednn").validate()
    with pytest.raises(ServerArgsError, match="needs --attention-backend cpu"):
        ServerArgs(model_path="m", enable_deterministic_inference=True, attention_backend="torch_native").validate()
    with pytest.raises(ServerArgsError, match="drop --quantization int8"):
        ServerArgs(model_path="m", enable_deterministic_inference=True, quantization="int8").validate()
    assert ServerArgs(model_path="m.gguf", enable_deterministic_inference=True).quantization_method() == "none"
    assert ServerArgs(model_path="m.gguf").quantization_method() is None
    with pytest.raises(ServerArgsError, match="CPU only"):
        ServerArgs(model_path="m", enable_deterministic_inference=True, device="cuda").validate()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bf16_gguf_blocks_do_not_depend_on_batch_chunking_or_cache(tmp_path, variant):
    """A GGUF with its Q4_1 / Q4_0 / Q8_0 blocks kept, in bf16 (``--dtype auto`` on AVX512-BF16): the
    quantized linears run the rows kernels for every number of rows (not a panel GEMM past 8 rows),
    so logprobs are bitwise the same alone, batched, chunked and after cache hits."""
    import torch

    from radixlm.kernels.quant.gemm import bf16_decode_preferred
    from radixlm.srt.cpu_runtime import cpu_info
    from tests.conftest import STORIES_GGUF
    from tests.engine.quant_models import STORIES_QUANT_LAYERS, STORIES_QUANT_TYPES, write_quantized_gguf

    if not bf16_decode_preferred(cpu_info(), torch.backends.cpu.get_cpu_capability()) or not _bf16_auto_is_batch_invariant():
        pytest.skip("no AVX512-BF16 rows kernel here, or bf16 dense layers on oneDNN (AMX)")
    path = str(write_quantized_gguf(STORIES_GGUF, tmp_path / "stories260K-q.gguf", STORIES_QUANT_TYPES))
    kw = {"dtype": "bfloat16", "max_total_tokens": 4096, "cache_dir": str(tmp_path)}
    solo = traces(Engine(path, **kw), STORY_PROMPTS[:6], batched=False)
    engine = Engine(path, **kw, **VARIANTS[variant])
    assert engine.get_server_info()["internal_state"]["quantized_layers"] == STORIES_QUANT_LAYERS
    assert traces(engine, STORY_PROMPTS[:6], batched=True) == solo
