"""Row-wise argmax of logits: greedy decoding's token choice, ``torch.argmax(logits, -1)`` exactly.

On CPU, float32 and bfloat16 logits go to ``torch.ops.radixlm_cpu.argmax_rows`` (``cpu/argmax.cpp``: two
vectorised passes per row, rows in parallel); torch's own CPU argmax over a 49,152-token vocabulary is
a scalar reduction (~3 ms a step for a batch of 64 on a 2-core Xeon). Anything else (CUDA, other
dtypes, 1-D input, no C++ kernels) takes ``torch.argmax``. Both give the first index of each row's
maximum, a NaN counting as the maximum.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def _cpu_op():
    """The C++ op, or None where the CPU kernels cannot be built (loaded on first use)."""
    from radixlm.kernels.cpu_extension import CpuKernelsUnavailable, load_cpu_kernels

    try:
        load_cpu_kernels()
    except CpuKernelsUnavailable:
        return None
    return torch.ops.radixlm_cpu.argmax_rows


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Args: logits (rows, V) on any device, V >= 1. Returns (rows,) int64 on the logits' device:
    the index of each row's maximum, as ``torch.argmax(logits, dim=-1)`` (ties: the first index;
    NaN: the first NaN)."""
    if logits.device.type == "cpu" and logits.dim() == 2 and logits.dtype in (torch.float32, torch.bfloat16) \
            and logits.shape[1] > 0 and logits.stride(1) == 1:
        op = _cpu_op()
        if op is not None:
            return op(logits)
    return torch.argmax(logits, dim=-1)
