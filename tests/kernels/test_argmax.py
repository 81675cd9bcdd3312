"""argmax_rows (kernels/argmax): the C++ CPU argmax gives torch.argmax's indices exactly, ties, NaN,
infinities and signed zeros included, for float32 logits and for bfloat16 ones (greedy decoding reads
the model's bf16 logits as they are: the index of the row's maximum is the one its fp32 widening has)."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.argmax import _cpu_op, argmax_rows

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def op():
    fn = _cpu_op()
    if fn is None:
        pytest.skip("C++ CPU kernels unavailable here")
    return fn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 16, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 49152])
def test_random_rows_match_torch(op, vocab, dtype):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(37, vocab, generator=g).to(dtype)
    assert torch.equal(op(x), torch.argmax(x, dim=-1))
    assert torch.equal(op(x), torch.argmax(x.float(), dim=-1))
    if dtype == torch.bfloat16 and vocab >= 1000:  # bf16 rounding makes ties common: first index wins
        y = (x * 4).round().to(dtype)
        assert torch.equal(op(y), torch.argmax(y.float(), dim=-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_pick_the_first_index(op, dtype):
    x = torch.zeros(6, 300)
    x[0, [5, 17, 250]] = 3.0            # max repeated: first wins
    x[1, [299, 100]] = 2.0
    x[2] = 1.0                          # all equal: index 0
    x[3, 64:] = float("inf")            # +inf ties
    x[4] = float("-inf")                # all -inf: index 0
    x[4, 200] = float("-inf")
    x[5, 10] = -0.0                     # -0.0 and +0.0 are equal: index 0 (a +0.0)
    x = x.to(dtype)
    got, want = op(x), torch.argmax(x, dim=-1)
    assert torch.equal(got, want), (got, want)
    assert got.tolist() == [5, 100, 0, 64, 0, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_counts_as_the_maximum(op, dtype):
    x = torch.randn(4, 500)
    x[0, 123] = float("nan")
    x[1, [7, 400]] = float("nan")       # the first NaN
    x[2, 499] = float("nan")            # in the scalar tail of the scan
    x[3, 0] = float("nan")
    x[3, 10] = float("inf")
    x = x.to(dtype)
    got = op(x)
    assert torch.equal(got, torch.argmax(x, dim=-1))
    assert got.tolist() == [123, 7, 499, 0]


def test_rows_with_a_stride_and_the_dispatcher(op):
    big = torch.randn(8, 1100)
    view = big[:, :1024]                 # stride(0) = 1100: rows of unit stride, not contiguous
    assert torch.equal(op(view), torch.argmax(view, dim=-1))
    assert torch.equal(argmax_rows(view), torch.argmax(view, dim=-1))
    half = big.to(torch.bfloat16)[:, :1024]  # bf16 rows, strided: the C++ op too
    assert torch.equal(op(half), torch.argmax(half, dim=-1))
    assert torch.equal(argmax_rows(half), torch.argmax(half, dim=-1))
    f16 = big.to(torch.float16)          # other dtypes: torch.argmax
    assert torch.equal(argmax_rows(f16), torch.argmax(f16, dim=-1))
    assert argmax_rows(torch.randn(0, 10)).shape == (0,)


def test_bad_input_raises(op):
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        op(torch.randn(3, 10, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        op(torch.randn(3, 10, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="rows"):
        op(torch.randn(10))
