"""What the launcher starts for ``--dp-size N``: N scheduler process groups (replicas), each of
``--tp-size`` ranks, named so a log line or a death notice says which replica it is.

Replica ``k`` gets its own sockets (``IpcPaths.for_dp_rank``); rank 0 of each replica owns them, as
rank 0 of a lone TP group does. CPU threads: without ``--cpu-threads`` (or ``OMP_NUM_THREADS``) the
available cores are split between all ``N * tp_size`` scheduler ranks, so replicas do not
oversubscribe the cores (each OpenMP region would then wait for a descheduled thread).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from radixlm.srt.server_args import ServerArgs


def scheduler_name(dp_rank: int, tp_rank: int, dp_size: int) -> str:
    """``scheduler`` / ``scheduler-tp1`` with one replica; ``scheduler-dp1`` / ``scheduler-dp1-tp1``
    (replica 1, TP rank 1) with several."""
    name = "scheduler" if dp_size == 1 else f"scheduler-dp{dp_rank}"
    return name if tp_rank == 0 else f"{name}-tp{tp_rank}"


def scheduler_title(process_name: str, tp_rank: int) -> str:
    """The ``ps`` title of a scheduler process from its ``scheduler_name`` (as the launcher names the
    process, ``radixlm-`` + it): ``scheduler_TP0`` with one replica, ``scheduler_DP1_TP0`` with several, as
    SGLang's ``sglang::scheduler_DP1_TP0``; ``tp_rank`` where the name says nothing (a process started
    otherwise)."""
    parts = process_name.removeprefix("radixlm-").split("-")
    if parts[0] != "scheduler":
        return f"scheduler_TP{tp_rank}"
    dp = next((p[2:] for p in parts[1:] if p.startswith("dp")), None)
    tp = next((p[2:] for p in parts[1:] if p.startswith("tp")), "0")
    return f"scheduler_TP{tp}" if dp is None else f"scheduler_DP{dp}_TP{tp}"


def scheduler_specs(args: ServerArgs, paths: Any, target: Callable[..., None],
                    tp_ranks: Optional[Sequence[int]] = None) -> list[tuple[str, Callable[..., None], tuple]]:
    """``(name, target, target_args)`` of every scheduler process: ``target(args, replica_paths, tp_rank)``
    (the launcher appends the ready pipe). ``args`` has the resolved model path; ``cpu_threads`` is
    set per rank here when the user left it to us. Replica ``k`` of several samples unseeded requests
    with ``random_seed + k`` (the TP ranks of one replica share it): with one seed every replica drew
    the same random stream, so the same request sent to two replicas sampled the same text.
    ``tp_ranks``: this node's ranks (multi-node TP, where ``dp_size`` is 1 and ``paths`` is None off
    node 0); default all."""
    from radixlm.srt.cpu_runtime import cpu_threads

    if args.dp_size > 1:
        args = dataclasses.replace(args, cpu_threads=cpu_threads(args.cpu_threads, args.tp_size * args.dp_size))
    specs = []
    for dp_rank in range(args.dp_size):
        replica_paths = paths.for_dp_rank(dp_rank, args.dp_size) if paths is not None else None
        replica_args = dataclasses.replace(args, random_seed=args.random_seed + dp_rank) if dp_rank else args
        specs += [(scheduler_name(dp_rank, tp_rank, args.dp_size), target, (replica_args, replica_paths, tp_rank))
                  for tp_rank in (range(args.tp_size) if tp_ranks is None else tp_ranks)]
    return specs
