"""Multi-node tensor parallelism (``--nnodes 2 --node-rank 0/1 --dist-init-addr``) as two
``radixlm serve`` processes on loopback: greedy output equals the single-process engine's, node 1
has no HTTP port and exits 0 when node 0 stops, node 0 exits 1 when node 1 dies, and bad flag
combinations are errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from radixlm.srt.multinode import dist_init_method, node_layout_error, node_tp_ranks, parse_host_port
from radixlm.srt.server_args import ServerArgs, ServerArgsError
from tests.conftest import STORY_PROMPTS
from tests.server.helpers import BASE_ARGS, ServerProcess, descendants, free_port, greedy, pid_alive

LAUNCH = [sys.executable, "-m", "radixlm.srt.launch_server"]


# ---- flags ----------------------------------------------------------------------------------------
def test_ranks_are_split_evenly_over_nodes():
    assert [list(node_tp_ranks(4, 2, r)) for r in range(2)] == [[0, 1], [2, 3]]
    assert [list(node_tp_ranks(2, 2, r)) for r in range(2)] == [[0], [1]]
    assert list(node_tp_ranks(3, 1, 0)) == [0, 1, 2]


def test_init_method_is_tcp_with_an_address_else_the_rendezvous_file():
    assert dist_init_method("10.0.0.1:5000", "/tmp/x/tp_rendezvous") == "tcp://10.0.0.1:5000"
    assert dist_init_method("[::1]:5000", None) == "tcp://[::1]:5000"
    assert dist_init_method(None, "/tmp/x/tp_rendezvous") == "file:///tmp/x/tp_rendezvous"
    assert parse_host_port("node0.local:29500") == ("node0.local", 29500)


@pytest.mark.parametrize("kwargs, needle", [
    ({"tp_size": 3, "nnodes": 2, "dist_init_addr": "127.0.0.1:5000"}, "--nnodes 2 must divide --tp-size 3"),
    ({"tp_size": 2, "nnodes": 2, "node_rank": 2, "dist_init_addr": "127.0.0.1:5000"}, "--node-rank must be in 0..1"),
    ({"tp_size": 2, "nnodes": 2, "node_rank": -1, "dist_init_addr": "127.0.0.1:5000"}, "--node-rank must be in 0..1"),
    ({"tp_size": 2, "nnodes": 2}, "--nnodes > 1 needs --dist-init-addr"),
    ({"tp_size": 2, "nnodes": 0}, "--nnodes must be >= 1"),
    ({"tp_size": 2, "nnodes": 2, "dist_init_addr": "127.0.0.1"}, "--dist-init-addr: expected HOST:PORT"),
    ({"tp_size": 2, "nnodes": 2, "dist_init_addr": "127.0.0.1:99999"}, "port in 1..65535"),
    ({"tp_size": 2, "nnodes": 2, "dist_init_addr": ":5000"}, "--dist-init-addr: expected HOST:PORT"),
])
def test_bad_node_flags_are_errors(kwargs, needle):
    assert node_layout_error(kwargs.get("tp_size", 1), kwargs.get("nnodes", 1), kwargs.get("node_rank", 0),
                             kwargs.get("dist_init_addr")) is not None
    with pytest.raises(ServerArgsError, match=needle.replace("..", r"\.\.").replace("(", r"\(")):
        ServerArgs.from_kwargs(**kwargs)


def test_bad_node_flags_on_the_command_line_exit_2_with_the_reason():
    proc = subprocess.run([*LAUNCH, "--tp-size", "2", "--nnodes", "2", "--node-rank", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--nnodes > 1 needs --dist-init-addr" in proc.stderr


# ---- two nodes on loopback --------------------------------------------------------------------------
def _node_args(model: str, node_rank: int, addr: str) -> list[str]:
    # One intra-op thread per process: the two "nodes" share this machine's cores.
    return ["--model-path", model, "--tp-size", "2", "--nnodes", "2", "--node-rank", str(node_rank),
            "--dist-init-addr", addr, "--cpu-threads", "1", "--dtype", "float32", *BASE_ARGS]


def _start_worker_node(args: list[str]) -> ServerProcess:
    """A ``--node-rank 1`` process: no HTTP port to wait on (``port`` 0), its log in a temp file."""
    fd, log_path = tempfile.mkstemp(prefix="radixlm-node1-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen([*LAUNCH, *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return ServerProcess(proc, 0, log_path, None)


def _start_two_nodes(model: str) -> tuple[ServerProcess, ServerProcess]:
    addr = f"127.0.0.1:{free_port()}"
    node1 = _start_worker_node(_node_args(model, 1, addr))
    try:
        node0 = ServerProcess.start(_node_args(model, 0, addr), command=LAUNCH)
    except Exception:
        log = node1.log()
        _discard(node1)
        raise AssertionError(f"node 0 did not start; node 1's log:\n{log[-4000:]}") from None
    return node0, node1


def _discard(*nodes: ServerProcess) -> None:
    for node in nodes:
        if node.proc.poll() is None:
            node.kill()
        os.unlink(node.log_path)


def test_two_nodes_equal_tp1_and_node1_exits_when_node0_stops(stories_path):
    from radixlm.srt.engine import Engine

    prompts = STORY_PROMPTS[:8]
    sp = greedy(16, min_new_tokens=16)
    engine = Engine(stories_path, dtype="float32", max_total_tokens=4096)
    expected = [o["output_ids"] for o in engine.generate(prompts, sp)]
    node0, node1 = _start_two_nodes(stories_path)
    try:
        node1_children = descendants(node1.proc.pid)
        with node0.client() as http:
            outs = http.post("/generate", json={"text": prompts, "sampling_params": sp}).json()
            assert [o["output_ids"] for o in outs] == expected
            # The same prompt again: served from the radix cache of both ranks, same tokens.
            again = http.post("/generate", json={"text": prompts[3], "sampling_params": sp}).json()
            assert again["output_ids"] == expected[3]
            assert again["meta_info"]["cached_tokens"] > 0
            info = http.get("/get_server_info").json()
            assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (2, 2, 0)
        log1 = node1.log()
        assert "TP ranks 1..1" in log1 and "scheduler-tp1" in log1
        assert "listening on" not in log1 and "detokenizer" not in log1  # no HTTP, no detokenizer there
        assert node0.stop() == 0
        assert node1.wait_exit(60) == 0, node1.log()[-4000:]
        log1 = node1.log()
        assert "rank 0 stopped (node 0 is shutting down)" in log1
        assert "node 0 stopped" in log1
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in node1_children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in node1_children if pid_alive(p)]
    finally:
        _discard(node0, node1)


@pytest.mark.slow  # a second pair of launches (~30 s quiet, 90 s on a busy 2-core box)
def test_node0_exits_with_an_error_when_node1_dies(stories_path):
    node0, node1 = _start_two_nodes(stories_path)
    try:
        with node0.client() as http:
            assert http.post("/generate", json={"text": "Lily", "sampling_params": greedy(4)}).status_code == 200
        node1.proc.send_signal(signal.SIGTERM)  # node 1 stops its rank, which leaves the group
        assert node1.wait_exit(30) == 0
        assert node0.wait_exit(60) == 1
        log0 = node0.log()
        assert "lost a tensor-parallel rank" in log0
        assert "the scheduler process died (exit code 1)" in log0
        with pytest.raises(httpx.HTTPError):
            httpx.get(node0.url + "/health", timeout=2)
    finally:
        _discard(node0, node1)
