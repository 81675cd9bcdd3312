"""FlashInfer backend on CPU: the module imports without flashinfer; its plan arguments (indptr and
slot indices from real pools laid out by KVManager + RadixCache, page sizes 1 and 16, with and
without cached prefixes) equal torch_native's view of the same batch; and, through a pure-torch
stand-in for flashinfer's wrappers (tests/kernels/fake_flashinfer.py), the backend's outputs and
K/V stores equal torch_native's, CUDA-graph padding included."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from radixlm.kernels.attention.flashinfer_backend import (
    build_kv_indices, build_prefix_kv, build_qo_indptr, flashinfer_supports, kv_last_page_len, pad_decode_kv)
from radixlm.kernels.attention.torch_native import TorchNativeAttnBackend
from radixlm.srt.cuda_graph_runner import capture_batch_sizes, padded_batch_size
from radixlm.srt.forward_batch import ForwardBatch
from tests.kernels import fake_flashinfer
from tests.kernels.paged_batches import (cache_prompt, finish_step, make_setup, mixed_prompts, schedule_decode,
                                         schedule_extend)

I32 = torch.int32


def segments(indptr: torch.Tensor, values: torch.Tensor) -> list[list[int]]:
    return [values[int(indptr[i]):int(indptr[i + 1])].tolist() for i in range(indptr.numel() - 1)]


def native_view(setup, batch):
    """torch_native's metadata for ``batch``: per request the KV slots it attends over."""
    fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, setup.kv_pool,
                               TorchNativeAttnBackend(4, 2, 8, 0.125), torch.device("cpu"))
    seq_lens = batch.seq_lens
    per_req = {}
    for block in fb.attn_metadata:
        slots = block.slots.view(block.num_reqs, block.num_keys)
        shared = [] if block.prefix_slots is None else block.prefix_slots.tolist()  # a cascade block
        for j, i in enumerate(block.req_ids):
            per_req[i] = shared + slots[j, :seq_lens[i] - len(shared)].tolist()
    return [per_req[i] for i in range(batch.batch_size)]


def test_module_imports_without_flashinfer():
    code = ("import sys; sys.modules['flashinfer'] = None\n"  # None makes `import flashinfer` fail
            "import radixlm.kernels.attention.flashinfer_backend as fb, radixlm.srt.cuda_graph_runner\n"
            "import radixlm.kernels.gpu_sampling\n"
            "try:\n    fb.FlashInferAttnBackend(8, 2, 64, 0.125)\n"
            "except ImportError as e:\n    print('ImportError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ImportError the flashinfer attention backend needs flashinfer-python" in out.stdout


def test_small_helpers_exact():
    assert build_qo_indptr([3, 1, 4]).tolist() == [0, 3, 4, 8]
    assert build_qo_indptr([3]).dtype == I32
    table = torch.arange(40).view(4, 10)
    indptr, indices = build_kv_indices(table, torch.tensor([2, 0, 3]), [3, 0, 2])
    assert (indptr.tolist(), indices.tolist()) == ([0, 3, 3, 5], [20, 21, 22, 30, 31])
    assert indptr.dtype == indices.dtype == I32
    empty = build_kv_indices(table, torch.tensor([], dtype=torch.int64), [])
    assert empty[0].tolist() == [0] and empty[1].numel() == 0
    assert kv_last_page_len(3).tolist() == [1, 1, 1]
    padded = pad_decode_kv(indptr, indices, 2)
    assert (padded[0].tolist(), padded[1].tolist()) == ([0, 3, 3, 5, 6, 7], [20, 21, 22, 30, 31, 0, 0])
    plan = build_prefix_kv(table, torch.tensor([1, 2]), [0, 4], [3, 1])
    assert plan.qo_indptr.tolist() == [0, 3, 4] and plan.prefix_kv_indptr.tolist() == [0, 0, 4]
    assert plan.prefix_kv_indices.tolist() == [20, 21, 22, 23] and plan.has_prefix
    assert flashinfer_supports(64, torch.bfloat16) and not flashinfer_supports(8)
    assert not flashinfer_supports(128, torch.float32)


def test_capture_batch_sizes():
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(10) == [1, 2, 4, 8, 10]
    assert capture_batch_sizes(64) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
    big = capture_batch_sizes(600)
    assert big[-4:] == [512, 544, 576, 600] and 264 not in big and 272 in big
    assert padded_batch_size([1, 2, 4, 8], 3) == 4 and padded_batch_size([1, 2, 4, 8], 9) is None


@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_and_decode_plans_match_torch_native(page_size):
    setup = make_setup(page_size)
    earlier, prompts = mixed_prompts(page_size)
    cache_prompt(setup, earlier)
    reqs, batch = schedule_extend(setup, prompts)
    # The tree holds the earlier prompt's page-aligned tokens; a match never covers the last token.
    assert batch.prefix_lens == ([35, 0, 41, 0] if page_size == 1 else [32, 0, 32, 0])
    table, rows = setup.req_to_token_pool.req_to_token, torch.tensor(batch.req_pool_indices)
    native = native_view(setup, batch)

    plan = build_prefix_kv(table, rows, batch.prefix_lens, batch.extend_lens)
    assert plan.has_prefix
    assert torch.diff(plan.qo_indptr).tolist() == batch.extend_lens
    full_indptr, full_indices = build_kv_indices(table, rows, batch.seq_lens)
    assert segments(full_indptr, full_indices) == native
    prefixes = [s[:p] for s, p in zip(native, batch.prefix_lens)]
    assert segments(plan.prefix_kv_indptr, plan.prefix_kv_indices) == prefixes
    # The ragged part's K/V rows (new tokens, flat in batch order) are exactly the slots they are stored at.
    new_slots = [s[p:] for s, p in zip(native, batch.prefix_lens)]
    assert segments(plan.qo_indptr, torch.tensor(batch.out_cache_loc)) == new_slots
    if page_size > 1:  # slots of one page are consecutive within a request's row
        for s in native:
            assert all(b == a + 1 for a, b in zip(s, s[1:]) if b % page_size)

    for _ in range(2):  # two decode steps: one fills the partial last pages, one may open new ones
        finish_step(reqs)
        dec = schedule_decode(setup, reqs)
        indptr, indices = build_kv_indices(table, torch.tensor(dec.req_pool_indices), dec.seq_lens)
        assert segments(indptr, indices) == native_view(setup, dec)
        assert [s[-1] for s in segments(indptr, indices)] == dec.out_cache_loc


def test_extend_without_prefix():
    setup = make_setup(16)
    _, prompts = mixed_prompts(16)
    _reqs, batch = schedule_extend(setup, [prompts[1], prompts[3]])
    table = setup.req_to_token_pool.req_to_token
    plan = build_prefix_kv(table, torch.tensor(batch.req_pool_indices), batch.prefix_lens, batch.extend_lens)
    assert not plan.has_prefix and plan.prefix_kv_indptr.tolist() == [0, 0, 0]
    assert plan.prefix_kv_indices.numel() == 0 and plan.qo_indptr.tolist() == [0, 23, 26]
    assert segments(plan.qo_indptr, torch.tensor(batch.out_cache_loc)) == native_view(setup, batch)


# ---- the backend end to end, over the pure-torch flashinfer stand-in -------------------------------
H, KVH, D = 8, 2, 64


@pytest.fixture
def fake_fi(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    fake_flashinfer.CALLS.clear()
    return fake_flashinfer


def _run_both(setup, batch, backend, seed):
    """Run ``backend`` (bf16 pool) and torch_native (fp32 copy of the pool) on the same batch."""
    g = torch.Generator().manual_seed(seed)
    t = len(batch.input_ids)
    q, k, v = (torch.randn(t, n * D, generator=g) for n in (H, KVH, KVH))
    oracle_pool = setup.kv_pool.relayout("HND", torch.float32)
    cpu = torch.device("cpu")
    fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, setup.kv_pool, backend, cpu)
    out = backend.forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0, fb)
    ref_fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, oracle_pool,
                                   TorchNativeAttnBackend(H, KVH, D, D ** -0.5), cpu)
    ref = ref_fb.attn_backend.forward(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), 0, ref_fb)
    loc = torch.tensor(batch.out_cache_loc)
    assert torch.equal(setup.kv_pool.k_buffers[0][loc], k.bfloat16().view(t, KVH, D))
    assert torch.equal(setup.kv_pool.v_buffers[0][loc], v.bfloat16().view(t, KVH, D))
    return out, ref


def _bf16_setup(page_size):
    setup = make_setup(page_size, kv_heads=KVH, head_dim=D, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    for buf in setup.kv_pool.k_buffers + setup.kv_pool.v_buffers:  # "cached" K/V everywhere
        buf.copy_(torch.randn(buf.shape, generator=g))
    return setup


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("use_ragged", [True, False])
def test_backend_matches_torch_native(fake_fi, page_size, use_ragged):
    from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend

    setup = _bf16_setup(page_size)
    earlier, prompts = mixed_prompts(page_size)
    cache_prompt(setup, earlier)
    backend = FlashInferAttnBackend(H, KVH, D, D ** -0.5, use_ragged=use_ragged, workspace_bytes=16)
    reqs, batch = schedule_extend(setup, prompts)
    out, ref = _run_both(setup, batch, backend, seed=2)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    kinds = [k for k, _ in fake_fi.CALLS]
    assert kinds == (["ragged", "paged"] if use_ragged else ["paged"])
    paged = fake_fi.CALLS[-1][1]
    assert paged["causal"] is (not use_ragged) and paged["page_size"] == 1
    assert paged["last_page_len"].tolist() == [1] * 4 and paged["heads"] == (H, KVH, D)
    assert paged["sm_scale"] == D ** -0.5 and paged["dtype"] == (torch.bfloat16, torch.bfloat16)
    finish_step(reqs)
    out, ref = _run_both(setup, schedule_decode(setup, reqs), backend, seed=3)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert fake_fi.CALLS[-1][0] == "decode"
    assert backend.decode_use_tensor_cores  # GQA group of 4: SGLang's rule


def test_backend_prefix_free_extend_is_one_ragged_pass(fake_fi):
    from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend

    setup = _bf16_setup(1)
    backend = FlashInferAttnBackend(H, KVH, D, D ** -0.5, workspace_bytes=16)
    _, prompts = mixed_prompts(1)
    _reqs, batch = schedule_extend(setup, prompts)
    out, ref = _run_both(setup, batch, backend, seed=4)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert [k for k, _ in fake_fi.CALLS] == ["ragged"] and fake_fi.CALLS[0][1]["causal"] is True


def test_backend_cuda_graph_padding(fake_fi):
    """Graph-mode planning: one wrapper per captured size over shared buffers; padded rows attend to
    slot 0 only; the real rows' outputs equal torch_native's."""
    from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend

    setup = _bf16_setup(16)
    earlier, prompts = mixed_prompts(16)
    cache_prompt(setup, earlier)
    backend = FlashInferAttnBackend(H, KVH, D, D ** -0.5, workspace_bytes=16)
    reqs, batch = schedule_extend(setup, prompts[:3])
    _run_both(setup, batch, backend, seed=5)
    finish_step(reqs)
    dec = schedule_decode(setup, reqs)
    cpu = torch.device("cpu")
    backend.init_cuda_graph_state(8, 8 * 512, cpu)
    fb = ForwardBatch.init_new(dec, setup.req_to_token_pool, setup.kv_pool, backend, cpu)
    ref_native = native_view(setup, dec)
    fb.batch_size = 4  # padded to the captured size 4: one padding row
    backend.init_forward_metadata_cuda_graph(fb, num_real=3)
    plan = fake_fi.CALLS[-1][1]
    assert segments(plan["indptr"], plan["indices"]) == ref_native + [[0]]
    wrapper = fb.attn_metadata.wrapper
    assert wrapper.use_cuda_graph and wrapper.buffers[0].numel() == 5
    backend.init_forward_metadata_cuda_graph(fb, num_real=2)  # replan: same wrapper, new rows
    assert fb.attn_metadata.wrapper is wrapper
    assert segments(fake_fi.CALLS[-1][1]["indptr"], fake_fi.CALLS[-1][1]["indices"]) == ref_native[:2] + [[0], [0]]
    fb.batch_size = 8
    backend.init_forward_metadata_cuda_graph(fb, num_real=0)  # capture-time plan: all padding
    assert fb.attn_metadata.wrapper is not wrapper and fake_fi.CALLS[-1][1]["indptr"].tolist() == list(range(9))


def test_backend_rejects_what_flashinfer_cannot_run(fake_fi):
    from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend

    with pytest.raises(ValueError, match="head_dim"):
        FlashInferAttnBackend(8, 4, 8, 8 ** -0.5)
    with pytest.raises(ValueError, match="multiple"):
        FlashInferAttnBackend(9, 2, 64, 0.125)
    setup = make_setup(1, kv_heads=KVH, head_dim=D)  # float32 pool
    _, batch = schedule_extend(setup, [[3, 4, 5]])
    with pytest.raises(ValueError, match="float16/bfloat16"):
        ForwardBatch.init_new(batch, setup.req_to_token_pool, setup.kv_pool,
                              FlashInferAttnBackend(H, KVH, D, 0.125), torch.device("cpu"))


def test_engine_with_emulated_flashinfer(fake_fi, monkeypatch, tmp_path):
    """The whole engine over the backend (emulated kernels, bf16): chunked prefill (later chunks
    attend over a cached prefix), decode, and a follow-up served from the radix cache give
    transformers' greedy tokens up to bf16 near-ties."""
    import radixlm.srt.model_runner as model_runner
    from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend
    from radixlm.srt.engine import Engine
    from tests.engine.reference import hf_greedy
    from tests.gpu.helpers import assert_greedy_close, save_random_llama

    monkeypatch.setattr(model_runner, "create_attention_backend",
                        lambda name, device, dtype=None, **kw: FlashInferAttnBackend(**kw))
    path = save_random_llama(str(tmp_path / "gqa3"), "gqa3")
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (1, 17, 40, 90)]
    ref = hf_greedy(path, tuple(map(tuple, prompts)), 8)
    engine = Engine(path, dtype="bfloat16", max_total_tokens=2048, chunked_prefill_size=16, page_size=4)
    sp = {"temperature": 0, "max_new_tokens": 8, "min_new_tokens": 8}
    assert isinstance(engine.worker.model_runner.attn_backend, FlashInferAttnBackend)
    ours = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)]
    assert_greedy_close(path, prompts, ours, ref, 0.25)
    again = engine.generate(input_ids=prompts[3], sampling_params=sp)
    assert again["meta_info"]["cached_tokens"] == 88
    assert_greedy_close(path, prompts[3:], [again["output_ids"]], ref[3:], 0.25)
    assert {k for k, _ in fake_fi.CALLS} == {"ragged", "paged", "decode"}
    engine.scheduler.kv.check_idle()
