"""The whole engine on CUDA: greedy tokens equal transformers' (fp32 reference) for stories260K
(fp32, torch_native: head_dim 8 is not a FlashInfer size), random-weight Llamas with FlashInfer
(bf16, page sizes 1 and 16, chunked prefill so later chunks attend over a cached prefix, and a
follow-up served from the radix cache), and SmolLM2 when its weights are installed. bf16 runs may
differ from the reference only at near-ties (``helpers.assert_greedy_close``)."""

from __future__ import annotations

import pytest

from radixlm.srt.engine import Engine
from tests.engine.reference import hf_greedy
from tests.gpu.helpers import assert_greedy_close, save_random_llama, stories_path

pytestmark = pytest.mark.gpu
MAX_NEW = 16
FP32_TOL = 1e-3
BF16_TOL = 0.25
STORY_PROMPTS = ["Once upon a time", "Lily", "The cat sat on the mat and", "Ben and Mia were best friends",
                 "One day, a little boy named Tim went to the park with his mom. He saw a big"]


def _greedy(n: int) -> dict:
    return {"temperature": 0, "max_new_tokens": n, "min_new_tokens": n}


def _run(engine: Engine, prompts: list[list[int]], n: int = MAX_NEW) -> list[list[int]]:
    return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=_greedy(n))]


@pytest.fixture(scope="module")
def stories():
    path = stories_path()
    if path is None:
        pytest.skip("stories260k-hf is missing from tests/assets/models")
    return path


@pytest.mark.parametrize("page_size", [1, 16])
def test_stories_torch_native_on_cuda(stories, page_size):
    engine = Engine(stories, device="cuda", attention_backend="torch_native", max_total_tokens=4096,
                    chunked_prefill_size=16, page_size=page_size, max_running_requests=8)
    assert engine.worker.model_runner.kv_pool.k_buffers[0].is_cuda
    prompts = [engine.tokenizer.encode(p) for p in STORY_PROMPTS]
    ref = hf_greedy(stories, tuple(map(tuple, prompts)), MAX_NEW)
    assert_greedy_close(stories, prompts, _run(engine, prompts), ref, FP32_TOL)
    assert "Lily" in engine.generate(STORY_PROMPTS[0], _greedy(20))["text"]
    engine.scheduler.kv.check_idle()


def test_auto_backend_on_cuda(stories, tmp_path):
    """``auto`` picks FlashInfer where it can run, torch_native where it cannot (stories260K)."""
    pytest.importorskip("flashinfer")
    engine = Engine(stories, device="cuda", max_total_tokens=1024)
    assert type(engine.worker.model_runner.attn_backend).__name__ == "TorchNativeAttnBackend"
    engine = Engine(save_random_llama(str(tmp_path / "m"), "gqa4"), device="cuda", max_total_tokens=1024)
    assert type(engine.worker.model_runner.attn_backend).__name__ == "FlashInferAttnBackend"


@pytest.fixture(scope="module", params=["gqa4", "gqa3"])
def random_model(request, tmp_path_factory):
    pytest.importorskip("flashinfer")
    return save_random_llama(str(tmp_path_factory.mktemp(request.param)), request.param)


@pytest.mark.parametrize("page_size", [1, 16])
def test_random_llama_flashinfer_matches_hf(random_model, page_size):
    import torch

    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (1, 3, 17, 40, 64, 150)]
    ref = hf_greedy(random_model, tuple(map(tuple, prompts)), MAX_NEW)
    engine = Engine(random_model, device="cuda", attention_backend="flashinfer", max_total_tokens=8192,
                    chunked_prefill_size=16, page_size=page_size, max_running_requests=8)
    assert engine.model_config.dtype == torch.bfloat16
    assert_greedy_close(random_model, prompts, _run(engine, prompts), ref, BF16_TOL)
    again = engine.generate(input_ids=prompts[5], sampling_params=_greedy(MAX_NEW))
    assert again["meta_info"]["cached_tokens"] == (len(prompts[5]) - 1) // page_size * page_size
    assert_greedy_close(random_model, prompts[5:], [again["output_ids"]], ref[5:], BF16_TOL)
    engine.scheduler.kv.check_idle()


def test_smollm2_flashinfer(tmp_path):
    pytest.importorskip("flashinfer")
    from radixlm.srt.model_loader import ModelLoadError, resolve_model_path

    try:
        path = resolve_model_path(None)
    except ModelLoadError as exc:
        pytest.skip(f"SmolLM2 not installed here: {exc}")
    engine = Engine(path, device="cuda", dtype="bfloat16", max_total_tokens=8192, page_size=16)
    tok = engine.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   tokenize=False, add_generation_prompt=True)
    prompts = [tok.encode(p) for p in ("Once upon a time", "The three primary colors are", chat)]
    ours = _run(engine, prompts, 12)
    assert "Paris" in tok.decode(ours[2])
    assert_greedy_close(path, prompts, ours, hf_greedy(path, tuple(map(tuple, prompts)), 12), BF16_TOL)
