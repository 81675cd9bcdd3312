"""Scheduler process entry: the model, the ``Scheduler`` and its ZMQ loop (DESIGN.md section 2).

Sockets (``ipc.IpcPaths``): PULL ``scheduler_input`` (bound here) for ``TokenizedGenerateReq``,
``AbortReq``, ``FlushCacheReq`` and ``GetInternalStateReq``; PUSH ``detokenizer_input`` for
``BatchTokenOut``; PUSH ``scheduler_rpc`` for control replies (``FlushCacheOut``,
``InternalState``), which go straight to the TokenizerManager in the order the requests came.

Loop: drain every queued message, then run ``Scheduler.step()`` while there is work; when a step
makes no progress (idle, or waiting requests that do not fit yet) block on the socket for at most
``_IDLE_POLL_MS`` so SIGTERM and a dead parent are noticed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from radixlm.managers.ipc import IpcPaths
    from radixlm.managers.scheduler import Scheduler
    from radixlm.srt.server_args import ServerArgs

from radixlm.managers.startup_error import report_startup_failure

logger = logging.getLogger(__name__)

_IDLE_POLL_MS = 50


def configure_child_logging(level: str) -> None:
    """Log to stderr (inherited from the launcher) with the process name in every line."""
    logging.basicConfig(level=level.upper(), format="[%(asctime)s %(processName)s] %(levelname)s %(name)s: %(message)s",
                        force=True)


def run_scheduler_process(server_args: "ServerArgs", paths: Optional["IpcPaths"], tp_rank: int,
                          ready_pipe: Optional["Connection"]) -> None:
    """Process entry (``multiprocessing`` spawn target), one per tensor-parallel rank.

    Args:
        server_args: with ``model_path`` already resolved to a local folder by the launcher.
        paths: the launch's ``IpcPaths``; None on a node other than 0 (``--node-rank`` > 0), whose
            ranks have no sockets and meet the group at ``--dist-init-addr``.
        tp_rank: this process's rank; rank 0 owns the sockets and broadcasts what it receives.
        ready_pipe: receives the str ``"ready"`` once the model is loaded and the sockets are up;
            ``"error: <one-line reason>"`` if setting up fails (``startup_error``), or
            ``"error: <traceback>"`` if the process crashes after ready.

    Exits 0 on SIGTERM (SIGINT, the terminal's Ctrl-C, is the launcher's to handle), when the parent
    dies, or (ranks > 0) when rank 0 stops or its connection closes; 1 on any error, logged (through ``os._exit``, skipping interpreter teardown).
    """
    import zmq

    from radixlm.srt.cpu_runtime import MMAP_THRESHOLD, TRIM_THRESHOLD, tune_malloc
    from radixlm.srt.dp_launch import scheduler_title
    from radixlm.srt.process_title import set_process_title

    configure_child_logging(server_args.log_level)
    set_process_title(scheduler_title(multiprocessing.current_process().name, tp_rank))
    if tune_malloc():
        logger.debug("glibc malloc: mmap threshold %d, trim threshold %d", MMAP_THRESHOLD, TRIM_THRESHOLD)
    # Ctrl-C reaches the whole process group: it is the launcher's to handle (it drains the open
    # requests, then stops us with SIGTERM), so SIGINT is ignored here, on every rank. SIGTERM keeps
    # its default (end at once) while the model loads: a stop during startup must not wait for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping: list[int] = []
    parent_pid = os.getppid()
    ctx = zmq.Context()
    sockets: list[Any] = []
    try:
        scheduler, receiver, reply, tp = _build(server_args, paths, ctx, sockets, tp_rank)
    except Exception as exc:
        report_startup_failure(logger, "scheduler" if tp_rank == 0 else f"scheduler-tp{tp_rank}", exc, ready_pipe)
        _close(sockets, ctx)
        _exit_now(1)
    if tp_rank == 0:  # from here on SIGTERM ends the loop cleanly (ranks > 0 hold nothing to clean up)
        signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    try:
        if ready_pipe is not None:
            ready_pipe.send("ready")
        logger.info("scheduler rank %d ready: max_total_num_tokens=%d", tp_rank, scheduler.kv.total_tokens)
        if tp.size > 1:
            _serve_tp(scheduler, receiver, reply, tp, stopping, parent_pid)
        elif not _serve(scheduler, receiver, reply, stopping, parent_pid):
            paths.remove()  # the launcher was killed and cannot clean up its IPC directory
    except Exception:
        tb = traceback.format_exc()
        logger.error("scheduler process crashed:\n%s", tb)
        if ready_pipe is not None:
            try:
                ready_pipe.send(f"error: {tb}")
            except OSError:
                pass  # the launcher is gone; the log has the error
        _close(sockets, ctx)
        _exit_now(1)
    scheduler.close()
    _close(sockets, ctx)
    _exit_now(0)


def _exit_now(code: int) -> None:
    """Exit without interpreter teardown: unloading torch and friends takes seconds on a busy
    machine, and the launcher waits for us. Everything worth keeping (logs) is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _build(args: "ServerArgs", paths: Optional["IpcPaths"], ctx: Any, sockets: list[Any], tp_rank: int
           ) -> tuple["Scheduler", Any, Any, Any]:
    """Sockets first (so the TokenizerManager can queue requests while the model loads), then the
    model. Only rank 0 has sockets; the others get rank 0's messages by broadcast."""
    import os.path

    import torch

    from radixlm.managers.ipc import PullReceiver, PushSender
    from radixlm.managers.scheduler import Scheduler, create_scheduler_grammar_backend
    from radixlm.managers.tp_worker import TpModelWorker
    from radixlm.srt.distributed import init_tp_group
    from radixlm.srt.model_config import ModelConfig
    from radixlm.srt.model_loader import load_tokenizer
    from radixlm.srt.model_runner import resolve_device
    from radixlm.srt.multinode import dist_init_method

    receiver = reply = None
    send_output: Any = lambda out: None  # noqa: E731  (ranks > 0 emit nothing)
    if tp_rank == 0:
        assert paths is not None  # rank 0 runs on node 0, which has the IPC directory
        receiver = PullReceiver(ctx, paths.scheduler_input, bind=True)
        sockets.append(receiver)
        to_detokenizer = PushSender(ctx, paths.detokenizer_input, bind=False)
        sockets.append(to_detokenizer)
        reply = PushSender(ctx, paths.scheduler_rpc, bind=False)
        sockets.append(reply)
        send_output = to_detokenizer.send
    device = resolve_device(args.device)
    if device.type == "cpu":
        from radixlm.srt.cpu_runtime import cpu_threads

        # --cpu-threads, else OMP_NUM_THREADS, else the available cores split between this node's
        # ranks: oversubscribing the cores makes every OpenMP region wait for a descheduled thread.
        torch.set_num_threads(cpu_threads(args.cpu_threads, args.tp_size // args.nnodes))
    rendezvous = os.path.join(paths.root, "tp_rendezvous") if paths is not None else None
    tp = init_tp_group(tp_rank, args.tp_size, dist_init_method(args.dist_init_addr, rendezvous), device)
    model_config = ModelConfig.from_path(args.model_path, dtype=args.model_dtype(), context_length=args.context_length,
                                         device=args.device, cache_dir=args.cache_dir)
    tokenizer = load_tokenizer(model_config.model_path, args.tokenizer_path, cache_dir=args.cache_dir)
    worker = TpModelWorker(model_config, args, tp)
    grammar = create_scheduler_grammar_backend(args, tokenizer, model_config)
    return Scheduler(args, worker, tokenizer, send_output, grammar), receiver, reply, tp


def _serve_tp(scheduler: "Scheduler", receiver: Any, reply: Any, tp: Any, stopping: list[int], parent_pid: int) -> None:
    """Lockstep loop of a TP group: each iteration rank 0 gathers its messages (waiting briefly when
    idle) and broadcasts them; every rank handles the same messages and runs the same step, so all
    ranks make identical scheduling decisions and meet in the model's collectives.

    Rank 0 stops on a signal or when its parent is gone: it aborts every request on all ranks, then
    ``broadcast_stop`` tells the others (on other nodes nobody else would). Ranks > 0 stop then, when
    rank 0's connection closes (its process died), or when their own parent is gone; a rank that
    leaves breaks rank 0's next broadcast, and node 0 exits with that error."""
    from radixlm.managers.io_struct import AbortReq
    from radixlm.srt.distributed import TpGroupStopped, broadcast_messages, broadcast_stop

    leak_checked = True
    aborted_all = False
    while True:
        msgs = None
        if tp.rank == 0:
            if aborted_all:
                # Every rank ran the same step after the abort; now they can be told to stop.
                try:
                    broadcast_stop(tp)
                except RuntimeError:
                    pass  # a rank is already gone; nothing left to tell it
                return
            if stopping or os.getppid() != parent_pid:
                msgs = [AbortReq(abort_all=True, message="server shutting down")]
                aborted_all = True
            else:
                msgs = receiver.recv_all_nowait()
                if not msgs and scheduler.is_idle():
                    msg = receiver.recv(timeout_ms=_IDLE_POLL_MS)
                    msgs = [msg] if msg is not None else []
        elif os.getppid() != parent_pid:
            logger.warning("scheduler rank %d: parent process %d exited; stopping", tp.rank, parent_pid)
            return
        try:
            received = broadcast_messages(tp, msgs)
        except TpGroupStopped:
            logger.info("scheduler rank %d: rank 0 stopped (node 0 is shutting down); exiting", tp.rank)
            return
        except RuntimeError as e:
            if tp.rank == 0 and (stopping or aborted_all):  # the launcher stops every rank at once
                logger.info("scheduler rank 0: the other ranks have already stopped")
                return
            if tp.rank == 0:
                raise RuntimeError(f"lost a tensor-parallel rank (its process or node is gone): {e}") from e
            logger.warning("scheduler rank %d: lost the connection to rank 0 (node 0 is gone: %s); exiting",
                           tp.rank, " ".join(str(e).split()))
            return
        for msg in received:
            out = scheduler.handle_message(msg)
            if out is not None and reply is not None:
                reply.send(out)
        if not scheduler.is_idle():
            leak_checked = False
            scheduler.step()
        elif not leak_checked:
            scheduler.step()
            leak_checked = True


def _serve(scheduler: "Scheduler", receiver: Any, reply: Any, stopping: list[int], parent_pid: int) -> bool:
    """Run until a signal lands in ``stopping`` (returns True) or the parent process is gone (False)."""
    def dispatch(msg: Any) -> None:
        out = scheduler.handle_message(msg)
        if out is not None:
            reply.send(out)

    leak_checked = True
    while not stopping:
        if os.getppid() != parent_pid:
            logger.warning("scheduler: parent process %d exited; stopping", parent_pid)
            return False
        for msg in receiver.recv_all_nowait():
            dispatch(msg)
        if not scheduler.is_idle():
            leak_checked = False
            if scheduler.step():
                continue
        elif not leak_checked:
            scheduler.step()  # idle: runs the KV leak check, once per busy period (it walks the tree)
            leak_checked = True
        msg = receiver.recv(timeout_ms=_IDLE_POLL_MS)
        if msg is not None:
            dispatch(msg)
    return True


def _close(sockets: list[Any], ctx: Any) -> None:
    for sock in sockets:
        sock.close()
    ctx.term()
