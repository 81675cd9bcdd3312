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


def _tiny_llama(folder, stories_path, intermediate: int) -> str:
    """stories260K's tokenizer with random Llama weights of another intermediate size (bf16)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    base = LlamaConfig.from_pretrained(stories_path)
    cfg = LlamaConfig(vocab_size=base.vocab_size, hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                      bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id, torch_dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{stories_path}/{name}", folder / name)
    return str(folder)


def test_fused_gate_up_in_the_stack_and_the_modules(stories_path, tmp_path):
    """A bf16 model whose intermediate size the fused gate-up takes (a multiple of 48): its MLPs run
    silu(gate) * up inside the GEMM (gemm/cpu/swiglu.cpp) in the stack and in the modules alike, with the
    same ids and logprobs both ways."""
    from radixlm.kernels.gemm.cpu import CpuGemm
    import torch

    if not CpuGemm().swiglu_fusable(torch.zeros(96, 64, dtype=torch.bfloat16)):
        pytest.skip("no fused gate-up on this CPU (AVX512-BF16 without AMX)")
    engine = Engine(_tiny_llama(tmp_path / "tiny", stories_path, 96), dtype="bfloat16", max_total_tokens=4096,
                    chunked_prefill_size=16, cache_dir=str(tmp_path / "cache"))
    model = engine.worker.model_runner.model
    assert all(layer.mlp.gate_up_proj.fused_swiglu for layer in model.layers)
    stack = model.decoder_stack
    with_stack = traces(engine)
    assert stack.forwards > 0
    model.decoder_stack = None
    assert traces(engine) == with_stack
    engine.scheduler.kv.check_idle()
