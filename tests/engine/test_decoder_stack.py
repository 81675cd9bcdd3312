"""The decoder layers as one C++ call (``srt/models/decoder_stack.py``) compute bitwise what the layer
modules compute: greedy ids and every logprob (prompt and output) are equal with the stack and with
``model.decoder_stack = None``, for fp32 and bf16, packed, dense and quantized linears (int8 with a
dense down_proj, GGUF Q4_1 / Q4_0 / Q8_0 with a dense F32 layer), in batches, chunks and decode.

Model: stories260K.
"""

from __future__ import annotations

import pytest

from radixlm.kernels.cpu_extension import cpu_kernels_error
from radixlm.srt.engine import Engine
from radixlm.srt.models.decoder_stack import CpuDecoderStack
from tests.conftest import STORIES_GGUF, STORY_PROMPTS
from tests.engine.quant_models import STORIES_QUANT_TYPES, write_quantized_gguf

pytestmark = pytest.mark.skipif(cpu_kernels_error() is not None, reason="the C++ CPU kernels are unavailable")

SP = {"temperature": 0, "max_new_tokens": 12, "min_new_tokens": 12}


@pytest.fixture(scope="module")
def stories_q4_gguf(tmp_path_factory):
    return str(write_quantized_gguf(STORIES_GGUF, tmp_path_factory.mktemp("gguf") / "stories260K-q4.gguf",
                                    STORIES_QUANT_TYPES))


def traces(engine: Engine) -> list[tuple]:
    """Per prompt: output ids, output logprobs and prompt logprobs; one batch, then one at a time."""
    def one(o: dict) -> tuple:
        meta = o["meta_info"]
        return (o["output_ids"], [lp for lp, _, _ in meta["output_token_logprobs"]],
                [lp for lp, _, _ in meta["input_token_logprobs"]])

    engine.flush_cache()
    batch = [one(o) for o in engine.generate(STORY_PROMPTS[:6], SP, return_logprob=True, logprob_start_len=0)]
    solo = []
    for p in STORY_PROMPTS[:3]:
        engine.flush_cache()
        solo.append(one(engine.generate(p, SP, return_logprob=True, logprob_start_len=0)))
    return batch + solo


@pytest.mark.parametrize("case", ["fp32", "bf16", "int8", "q4_fp32", "q4_bf16"])
def test_stack_equals_the_layer_modules(stories_path, stories_q4_gguf, case, tmp_path):
    path = stories_q4_gguf if case.startswith("q4") else stories_path
    kw = {"dtype": "bfloat16" if case.endswith("bf16") else "float32", "max_total_tokens": 4096,
          "chunked_prefill_size": 16, "cache_dir": str(tmp_path)}
    if case == "int8":
        kw["quantization"] = "int8"
    engine = Engine(path, **kw)
    model = engine.worker.model_runner.model
    stack = model.decoder_stack
    assert isinstance(stack, CpuDecoderStack)
    fused = traces(engine)
    assert stack.forwards > 0, "no forward ran through the stack"
    model.decoder_stack = None
    modules = traces(engine)
    assert fused == modules
    engine.scheduler.kv.check_idle()


def test_batches_the_stack_cannot_run_take_the_modules(stories_q4_gguf, tmp_path):
    # fp32 activations over GGUF blocks: the rows kernel up to SMALL_M rows, the panel kernel beyond,
    # which the stack does not run: a 64-token prefill takes the modules, its decode the stack
    engine = Engine(stories_q4_gguf, dtype="float32", max_total_tokens=4096, cache_dir=str(tmp_path))
    stack = engine.worker.model_runner.model.decoder_stack
    from radixlm.kernels.quant.gemm import SMALL_M

    assert stack.kinds(SMALL_M + 1, _fb(stack)) is None and stack.kinds(1, _fb(stack)) is not None
    prompt = list(range(5, 69))
    out = engine.generate(input_ids=prompt, sampling_params=SP)
    assert len(out["output_ids"]) == SP["max_new_tokens"] and stack.forwards == SP["max_new_tokens"] - 1


def _fb(stack):
    class Batch:  # kinds() reads only the batch's attention backend
        attn_backend = stack.attn_backend

    return Batch()


def test_not_built_where_it_does_not_apply(stories_path):
    assert Engine(stories_path, dtype="float32", max_total_tokens=1024,
                  elementwise_backend="torch_native").worker.model_runner.model.decoder_stack is None
    assert Engine(stories_path, dtype="float32", max_total_tokens=1024,
                  attention_backend="torch_native").worker.model_runner.model.decoder_stack is None
