"""Tensor-parallel process groups over torch.distributed (gloo on CPU, NCCL on CUDA).

Each TP rank runs its own Scheduler + TpModelWorker process. Rank 0 alone receives requests; every
step it broadcasts what it received (``broadcast_messages``) so all ranks make identical scheduling
decisions and call the model together. Messages travel as msgpack bytes in a uint8 tensor — no
pickle (``broadcast_object_list`` would pickle).
"""

from __future__ import annotations

import datetime
from typing import Optional

import torch
import torch.distributed as dist

from radixlm.managers.io_struct import Message, decode, encode
from radixlm.srt.layers.parallel_state import TpGroup

# Ranks other than 0 wait in a broadcast while the server is idle; don't let gloo time them out.
IDLE_TIMEOUT = datetime.timedelta(days=365)


# The header rank 0 broadcasts instead of a message count when it stops (``broadcast_stop``).
_STOP_HEADER = -1


class TpGroupStopped(Exception):
    """Raised by ``broadcast_messages`` on ranks > 0 when rank 0 announced that it stops."""


def init_tp_group(rank: int, size: int, init_method: str, device: torch.device) -> TpGroup:
    """Join the TP group; returns this rank's ``TpGroup``.

    ``init_method`` is torch.distributed's: ``file://<path>`` (one node: a file in the launch's IPC
    directory) or ``tcp://HOST:PORT`` (several nodes: rank 0 opens the store there; see
    ``srt/multinode.py``). ``group`` carries model collectives (NCCL on CUDA, gloo on CPU);
    ``cpu_group`` (gloo) carries the scheduler's message broadcast.
    """
    if size == 1:
        return TpGroup()
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size, timeout=IDLE_TIMEOUT)
    cpu_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT) if backend == "nccl" else dist.group.WORLD
    return TpGroup(rank=rank, size=size, group=dist.group.WORLD, cpu_group=cpu_group)


def broadcast_messages(tp: TpGroup, messages: Optional[list[Message]]) -> list[Message]:
    """Rank 0 passes its messages; every rank returns the same list (in the same order).

    Raises:
        TpGroupStopped: on ranks > 0, when rank 0 called ``broadcast_stop`` instead.
        RuntimeError: (gloo) a peer's connection closed: its process is gone.
    """
    if tp.size == 1:
        return messages or []
    if tp.rank == 0:
        blobs = [encode(m) for m in messages or []]
        lengths = torch.tensor([len(blobs)] + [len(b) for b in blobs], dtype=torch.int64)
        header = torch.tensor([lengths.numel()], dtype=torch.int64)
    else:
        header = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(header, src=0, group=tp.cpu_group)
    if tp.rank != 0 and int(header.item()) == _STOP_HEADER:
        raise TpGroupStopped()
    if tp.rank != 0:
        lengths = torch.zeros(int(header.item()), dtype=torch.int64)
    dist.broadcast(lengths, src=0, group=tp.cpu_group)
    total = int(lengths[1:].sum().item())
    if total == 0:
        return list(messages or []) if tp.rank == 0 else []
    if tp.rank == 0:
        payload = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
    else:
        payload = torch.empty(total, dtype=torch.uint8)
    dist.broadcast(payload, src=0, group=tp.cpu_group)
    if tp.rank == 0:
        return list(messages or [])
    data = payload.numpy().tobytes()
    out, offset = [], 0
    for n in lengths[1:].tolist():
        out.append(decode(data[offset:offset + n]))
        offset += n
    return out


def broadcast_stop(tp: TpGroup) -> None:
    """Rank 0, in place of its next ``broadcast_messages``: tell the other ranks to stop (they get
    ``TpGroupStopped``). With several nodes this is how the other nodes learn that node 0 stops."""
    if tp.size > 1:
        dist.broadcast(torch.tensor([_STOP_HEADER], dtype=torch.int64), src=0, group=tp.cpu_group)


def all_reduce_min(tp: TpGroup, value: int) -> int:
    """The smallest ``value`` over ranks (e.g. KV pool sizes must agree)."""
    if tp.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.cpu_group)
    return int(t.item())


def all_reduce_min_list(tp: TpGroup, values: list[int]) -> list[int]:
    """Element-wise smallest ``values`` over ranks (every rank passes a list of the same length)."""
    if tp.size == 1 or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.cpu_group)
    return [int(v) for v in t.tolist()]
