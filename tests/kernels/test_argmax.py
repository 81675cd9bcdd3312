"""argmax_rows (kernels/argmax): the C++ CPU argmax gives torch.argmax's indices exactly, ties, NaN,
infinities and signed zeros included."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.argmax import _cpu_op, argmax_rows


@pytest.fixture(scope="module")
def op():
    fn = _cpu_op()
    if fn is None:
        pytest.skip("C++ CPU kernels unavailable here")
    return fn


@pytest.mark.parametrize("vocab", [1, 7, 16, 63, 64, 65, 1000, 49152])
def test_random_rows_match_torch(op, vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(37, vocab, generator=g)
    assert torch.equal(op(x), torch.argmax(x, dim=-1))


def test_ties_pick_the_first_index(op):
    x = torch.zeros(6, 300)
    x[0, [5, 17, 250]] = 3.0            # max repeated: first wins
    x[1, [299, 100]] = 2.0
    x[2] = 1.0                          # all equal: index 0
    x[3, 64:] = float("inf")            # +inf ties
    x[4] = float("-inf")                # all -inf: index 0
    x[4, 200] = float("-inf")
    x[5, 10] = -0.0                     # -0.0 and +0.0 are equal: index 0 (a +0.0)
    got, want = op(x), torch.argmax(x, dim=-1)
    assert torch.equal(got, want), (got, want)
    assert got.tolist() == [5, 100, 0, 64, 0, 0]


def test_nan_counts_as_the_maximum(op):
    x = torch.randn(4, 500)
    x[0, 123] = float("nan")
    x[1, [7, 400]] = float("nan")       # the first NaN
    x[2, 499] = float("nan")            # in the scalar tail of the scan
    x[3, 0] = float("nan")
    x[3, 10] = float("inf")
    got = op(x)
    assert torch.equal(got, torch.argmax(x, dim=-1))
    assert got.tolist() == [123, 7, 499, 0]


def test_rows_with_a_stride_and_the_dispatcher(op):
    big = torch.randn(8, 1100)
    view = big[:, :1024]                 # stride(0) = 1100: rows of unit stride, not contiguous
    assert torch.equal(op(view), torch.argmax(view, dim=-1))
    assert torch.equal(argmax_rows(view), torch.argmax(view, dim=-1))
    half = big.to(torch.bfloat16)        # other dtypes: torch.argmax
    assert torch.equal(argmax_rows(half), torch.argmax(half, dim=-1))
    assert argmax_rows(torch.randn(0, 10)).shape == (0,)


def test_bad_input_raises(op):
    with pytest.raises(RuntimeError, match="float32"):
        op(torch.randn(3, 10, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="rows"):
        op(torch.randn(10))
