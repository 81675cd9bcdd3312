"""Multi-node tensor parallelism: how TP ranks are laid out over nodes (SGLang's ``--nnodes``,
``--node-rank``, ``--dist-init-addr``). Pure functions, no torch.

``tp_size`` ranks are split evenly: node ``r`` of ``nnodes`` runs ranks
``[r * tp_size / nnodes, (r + 1) * tp_size / nnodes)``. Node 0 holds rank 0 (the one with the
sockets), the HTTP server and the detokenizer; the other nodes run only their scheduler ranks, which
get every request from rank 0's torch.distributed broadcast. The process group meets at
``tcp://<dist-init-addr>`` (the TCP store that rank 0 opens on that port) instead of the
single-node rendezvous file in the launch's IPC directory, which other machines cannot see.
"""

from __future__ import annotations

from typing import Optional


def parse_host_port(addr: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"[IPV6]:PORT"``) -> ``(host, port)``.

    Raises:
        ValueError: no port, a port that is not an integer in 1..65535, or an empty host.
    """
    host, sep, port_text = addr.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port in 1..65535, got {addr!r}")
    return host, int(port_text)


def node_layout_error(tp_size: int, nnodes: int, node_rank: int, dist_init_addr: Optional[str]) -> Optional[str]:
    """A one-line reason when the multi-node flags do not fit together, else None."""
    if nnodes < 1:
        return f"--nnodes must be >= 1, got {nnodes}"
    if not 0 <= node_rank < nnodes:
        return f"--node-rank must be in 0..{nnodes - 1} (--nnodes {nnodes}), got {node_rank}"
    if tp_size % nnodes:
        return f"--nnodes {nnodes} must divide --tp-size {tp_size} (each node runs tp_size / nnodes ranks)"
    if nnodes > 1 and dist_init_addr is None:
        return "--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address, the same on every node)"
    if dist_init_addr is not None:
        try:
            parse_host_port(dist_init_addr)
        except ValueError as e:
            return f"--dist-init-addr: {e}"
    return None


def node_tp_ranks(tp_size: int, nnodes: int, node_rank: int) -> range:
    """The TP ranks that run on node ``node_rank`` (flags already validated)."""
    per_node = tp_size // nnodes
    return range(node_rank * per_node, (node_rank + 1) * per_node)


def dist_init_method(dist_init_addr: Optional[str], rendezvous_file: Optional[str]) -> str:
    """The ``init_method`` of ``torch.distributed.init_process_group``: ``tcp://HOST:PORT`` when
    ``--dist-init-addr`` is given (any number of nodes), else ``file://`` in the launch's IPC dir."""
    if dist_init_addr is not None:
        host, port = parse_host_port(dist_init_addr)
        return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    if rendezvous_file is None:
        raise ValueError("a TP group needs --dist-init-addr or a rendezvous file")
    return f"file://{rendezvous_file}"
