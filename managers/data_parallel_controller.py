"""DataParallelController: the HTTP process's link to the ``--dp-size`` scheduler replicas.

Each replica is a scheduler process group (its TP ranks) with its own model copy, KV pool and radix
tree, its own ``scheduler_input`` socket (PUSH from here) and ``scheduler_rpc`` socket (PULL here,
control replies in the order the replica got the requests); all replicas send their outputs to the one
detokenizer, which hands them to the TokenizerManager (``IpcPaths.for_dp_rank``). With one replica
this is a plain pass-through, so a dp 1 server takes the same path.

Routing (``dispatch``): a ``LoadBalancer`` (``managers/load_balance``) picks the replica from the
prompt's token ids and the per-replica load, the number of requests routed there whose terminal
output has not arrived yet (the TokenizerManager reports finishes through ``on_finished``). A
request may be pinned instead (``data_parallel_rank``; n > 1 copies follow their prefill).

Control: an exact-rid abort goes to the replica that holds the rid (to every replica if the rid is
not known: it finished, or never existed); prefix aborts and ``abort_all`` go to every replica.
``control`` sends a message to every replica and returns their replies in replica order.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Sequence
from typing import Optional

import zmq

from radixlm.managers.io_struct import AbortReq, InternalState, Message, TokenizedGenerateReq
from radixlm.managers.ipc import AsyncPullReceiver, IpcPaths, PushSender, receive_forever
from radixlm.managers.load_balance import LoadBalancer

logger = logging.getLogger(__name__)


class DataParallelController:
    """Args: ctx (the TokenizerManager's ``zmq.Context``), replicas (one ``IpcPaths`` per replica,
    from ``IpcPaths.for_dp_rank``), policy (a ``LoadBalancer`` for ``len(replicas)``). Call
    ``start()`` inside the event loop, ``close()`` at shutdown."""

    def __init__(self, ctx: zmq.Context, replicas: Sequence[IpcPaths], policy: LoadBalancer) -> None:
        if policy.num_replicas != len(replicas):
            raise ValueError(f"policy is for {policy.num_replicas} replicas, got {len(replicas)}")
        self.policy = policy
        self.size = len(replicas)
        self._to = [PushSender(ctx, p.scheduler_input, bind=False) for p in replicas]
        self._rpc = [AsyncPullReceiver(ctx, p.scheduler_rpc, bind=True) for p in replicas]
        self._pending: list[collections.deque[tuple[type, asyncio.Future]]] = [collections.deque() for _ in replicas]
        self._tasks: list[asyncio.Task] = []
        self.owner: dict[str, int] = {}  # rid -> replica, until its terminal output arrives
        self.loads = [0] * self.size  # unfinished requests per replica
        self.routed = [0] * self.size  # requests sent to each replica since start

    def start(self) -> None:
        self._tasks = [asyncio.create_task(receive_forever(self._rpc[r], functools.partial(self._on_reply, r),
                                                           f"dp controller (replica {r})"), name=f"dp-control-{r}")
                       for r in range(self.size)]

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for sock in (*self._to, *self._rpc):
            sock.close()

    # ---- requests -----------------------------------------------------------------------------
    def dispatch(self, msg: TokenizedGenerateReq, dp_rank: Optional[int] = None) -> int:
        """Send a request to ``dp_rank`` or the policy's choice; returns the replica."""
        if dp_rank is None:
            replica = self.policy.select(msg.input_ids, self.loads) if self.size > 1 else 0
        else:
            if not 0 <= dp_rank < self.size:
                raise ValueError(f"data_parallel_rank must be in [0, {self.size}), got {dp_rank}")
            replica = dp_rank
            if self.size > 1:
                self.policy.record(msg.input_ids, replica)
        self.owner[msg.rid] = replica
        self.loads[replica] += 1
        self.routed[replica] += 1
        self._to[replica].send(msg)
        return replica

    def on_finished(self, rid: str) -> None:
        """The terminal output of ``rid`` arrived: it no longer counts as load."""
        replica = self.owner.pop(rid, None)
        if replica is not None:
            self.loads[replica] -= 1

    def abort(self, msg: AbortReq) -> None:
        replica = self.owner.get(msg.rid) if msg.exact and not msg.abort_all else None
        for r in [replica] if replica is not None else range(self.size):
            self._to[r].send(msg)

    # ---- control ------------------------------------------------------------------------------
    def control(self, msg: Message, reply_type: type) -> list[asyncio.Future]:
        """Send ``msg`` to every replica; one future per replica (in replica order) for its reply."""
        loop = asyncio.get_running_loop()
        futures = []
        for r in range(self.size):
            fut: asyncio.Future = loop.create_future()
            self._pending[r].append((reply_type, fut))
            self._to[r].send(msg)
            futures.append(fut)
        return futures

    def fail_pending(self, exc: BaseException) -> None:
        """End every awaited control reply with ``exc`` (a replica or the server is gone)."""
        for pending in self._pending:
            while pending:
                _, fut = pending.popleft()
                if not fut.done():
                    fut.set_exception(exc)

    def _on_reply(self, replica: int, msg: Message) -> None:
        """A control reply of ``replica``: it answers the oldest pending request (replies come in order)."""
        pending = self._pending[replica]
        if not pending:
            logger.warning("dp controller: unexpected %s from replica %d", type(msg).__name__, replica)
            return
        reply_type, fut = pending.popleft()
        if not isinstance(msg, reply_type):
            logger.error("expected %s from replica %d, got %s", reply_type.__name__, replica, type(msg).__name__)
        if not fut.done():
            fut.set_result(msg)

    # ---- introspection ------------------------------------------------------------------------
    def replica_stats(self) -> list[dict[str, int]]:
        """Per replica: ``dp_rank``, ``load`` (unfinished requests) and ``num_routed_reqs`` (since start)."""
        return [{"dp_rank": r, "load": self.loads[r], "num_routed_reqs": self.routed[r]} for r in range(self.size)]


_SAME_IN_EVERY_REPLICA = ("page_size", "context_len", "attention_backend", "gemm_backend", "elementwise_backend",
                          "quantization", "quantized_layers")


def merge_internal_states(states: Sequence[InternalState]) -> InternalState:
    """The server-wide view of the replicas' counters: sizes and counts summed (the server holds
    ``sum(max_total_num_tokens)`` KV slots), settings that every replica shares taken from the first,
    hierarchical-cache numbers summed key by key. One state is returned as it is."""
    if len(states) == 1:
        return states[0]
    first = states[0]
    values = {}
    for name in first.__struct_fields__:
        if name in _SAME_IN_EVERY_REPLICA:
            values[name] = getattr(first, name)
        elif name == "hicache":
            merged: dict[str, float] = {}
            for s in states:
                for k, v in s.hicache.items():
                    merged[k] = merged.get(k, 0) + v
            values[name] = merged
        else:
            values[name] = sum(getattr(s, name) for s in states)
    return InternalState(**values)
