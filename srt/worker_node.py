"""``radixlm serve --nnodes N --node-rank R (R > 0) --dist-init-addr HOST:PORT``: a node that runs only
its tensor-parallel scheduler ranks (``srt/multinode.py`` says which).

It opens no HTTP port and starts no tokenizer or detokenizer: rank 0 on node 0 receives every request
and broadcasts it to all ranks through torch.distributed. The ranks need nothing from node 0's IPC
directory (they have no sockets; the group meets at ``tcp://<dist-init-addr>``).

Lifetime: the ranks start, join the group (waiting for node 0 as long as it takes) and report ready.
When node 0 stops, rank 0 broadcasts a stop (or its connection closes if it died); the ranks exit 0,
and so does this process, after one log line saying why. A rank that fails makes this process stop
the others and exit 1 with its error (node 0 then exits too: its next broadcast fails). SIGTERM /
Ctrl-C stop the ranks and exit 0. Startup failures are one ``radixlm: error: ...`` line, exit 1, as
``launch_server``'s.
"""

from __future__ import annotations

import logging
import time

from radixlm.srt.launch_server import _Child, _start_children, _stop_children, _wait_ready, startup_failed
from radixlm.srt.multinode import node_tp_ranks
from radixlm.srt.server_args import ServerArgs
from radixlm.srt.stop_signals import StopDuringStartup, StopSignals, configure_launcher_logging

logger = logging.getLogger("radixlm.worker_node")

_POLL_S = 0.5


def launch_worker_node(args: ServerArgs) -> int:
    """Run this node's ranks until node 0 stops (0), a rank fails (1) or a signal arrives (0)."""
    configure_launcher_logging(args.log_level)
    signals = StopSignals()
    signals.install()
    children: list[_Child] = []
    try:
        from radixlm.srt.model_loader import ModelLoadError, resolve_model_path

        try:
            resolved = resolve_model_path(args.model_path, cache_dir=args.cache_dir)
        except ModelLoadError as e:
            return startup_failed(str(e))
        ranks = node_tp_ranks(args.tp_size, args.nnodes, args.node_rank)
        children = _start_children(args, resolved, None)
        logger.info("node %d of %d: TP ranks %d..%d; joining node 0 at %s", args.node_rank, args.nnodes,
                    ranks.start, ranks.stop - 1, args.dist_init_addr)
        if not _wait_ready(children):
            return 1
        signals.started = True
        logger.info("node %d ready; serving node 0's requests until it stops", args.node_rank)
        return _watch(children, signals.received)
    except StopDuringStartup:
        logger.info("stopped by signal during startup")
        return 0
    finally:
        signals.started = True  # from here on a signal only records
        _stop_children(children)


def _watch(children: list[_Child], stopping: list[int]) -> int:
    """Poll the ranks: all exited 0 -> node 0 stopped (0); one failed -> 1; a signal -> 0."""
    while not stopping:
        time.sleep(_POLL_S)
        failed = [c for c in children if not c.process.is_alive() and c.process.exitcode != 0]
        if failed:
            child = failed[0]
            logger.error("the %s process died (exit code %s); stopping this node. Its error:\n%s",
                         child.name, child.process.exitcode, child.error_text())
            return 1
        if all(not c.process.is_alive() for c in children):
            logger.info("node 0 stopped (every rank of this node has exited); exiting")
            return 0
    logger.info("stopped by signal")
    return 0
