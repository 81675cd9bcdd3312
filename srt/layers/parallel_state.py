"""Tensor-parallel group handle passed to layers by constructor (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class TpGroup:
    """This rank's place in the tensor-parallel group.

    ``group`` is a ``torch.distributed`` process group (gloo on CPU, NCCL on CUDA), or None when
    ``size == 1``; collectives are then no-ops.
    """

    rank: int = 0
    size: int = 1
    group: Optional[Any] = None
    cpu_group: Optional[Any] = None  # gloo group for CPU-side collectives (scheduler broadcasts)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over ranks, in place."""
        if self.size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's ``x`` along the last dimension, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)
