"""Helpers for the server tests: real server processes on loopback, SSE parsing, polling.

``ServerProcess.start(args)`` runs ``python -m radixlm.srt.launch_server --host 127.0.0.1 --port <free>
ARGS`` (or any command line that takes ``--port``), waits for ``GET /health`` and keeps the log in a
temp file. ``stop()`` sends SIGTERM (a second one after ``DRAIN_WAIT_S`` if requests are still
open: the first only drains them) and asserts a clean exit (status 0, within ``STOP_TIMEOUT_S``)
with no descendant process left alive.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx

from radixlm.srt.health_wait import wait_healthy

START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 15.0
DRAIN_WAIT_S = 5.0
# Small KV pool: faster start, and still room for the abort tests' 16 long requests.
BASE_ARGS = ["--max-total-tokens", "40000", "--log-level", "info"]
# Requests that no CPU finishes while a test waits, for tests that need one still running (issue: a
# test expected an 1,800-token request to outlast a 6 s limit, and a faster CPU finished it first).
# A server given ENDLESS_ARGS (after BASE_ARGS) has a 200k-token context and pool; an ENDLESS request
# decodes 190k tokens: 190k scheduler steps and attention whose cost grows with the square of the
# length (~10^13 FLOPs in all), many minutes on any machine. Only an abort, a timeout or shutdown
# ends it in a test's time.
ENDLESS_TOKENS = 190_000
ENDLESS_ARGS = ["--context-length", "200000", "--max-total-tokens", "250000"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ppid_map() -> dict[int, list[int]]:
    """parent pid -> live child pids, from /proc (zombies excluded: they have exited)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    tree, out, todo = _ppid_map(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class ServerProcess:
    """One launched server. ``url`` is its base URL; ``log()`` returns everything it printed."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: str, api_key: Optional[str]):
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.api_key = api_key
        self.known_children: set[int] = set()

    @classmethod
    def start(cls, args: list[str], command: Optional[list[str]] = None, api_key: Optional[str] = None,
              timeout_s: float = START_TIMEOUT_S, host: Optional[str] = "127.0.0.1") -> "ServerProcess":
        """``host=None`` passes no ``--host`` (the server's default bind address is used)."""
        port = free_port()
        host_args = ["--host", host] if host is not None else []
        command = command or [sys.executable, "-m", "radixlm.srt.launch_server"]
        if "--dtype" not in args:  # the fp32 oracle: tests compare with transformers and fp32 engines
            args = [*args, "--dtype", "float32"]
        fd, log_path = tempfile.mkstemp(prefix="radixlm-server-", suffix=".log")
        # ENDLESS_ARGS and the large-prompt tests give stories260K (2,048 positions) a longer context
        # on purpose: what they check is the server's bookkeeping, not the text.
        env = {**os.environ, "RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"} if "--context-length" in args else None
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen([*command, *host_args, "--port", str(port), *args], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        server = cls(proc, port, log_path, api_key)
        server._wait_healthy(timeout_s)
        server.known_children = set(descendants(proc.pid))
        return server

    def _wait_healthy(self, timeout_s: float) -> None:
        outcome = wait_healthy(self.url, self.proc, timeout_s)
        if outcome == "healthy":
            return
        if outcome == "exited":
            raise RuntimeError(f"server exited with {self.proc.returncode} during startup:\n{self.log()[-5000:]}")
        self.kill()
        raise RuntimeError(f"server not healthy after {timeout_s} s:\n{self.log()[-5000:]}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def child_pid(self, name: str) -> int:
        """Pid of the ``scheduler`` or ``detokenizer`` process, from the launcher's log line."""
        for line in self.log().splitlines():
            if f"started {name} process (pid " in line:
                return int(line.rsplit("(pid ", 1)[1].rstrip(")"))
        raise LookupError(f"no {name} process in the log")

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"server still running {timeout_s} s later:\n{self.log()[-5000:]}") from None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM; assert a clean exit and that no child process outlives the server."""
        self.known_children |= set(descendants(self.proc.pid))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # drains what is open (test requests that never end)...
            try:
                self.proc.wait(DRAIN_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)  # ...so the second stops it
        rc = self.wait_exit(timeout_s)
        # multiprocessing's resource tracker exits on its own once the launcher is gone (it reads
        # EOF); give it a moment.
        deadline = time.monotonic() + 3.0
        while any(pid_alive(p) for p in self.known_children) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in self.known_children if pid_alive(p)]
        for pid in left:  # do not leak them into later tests, then fail
            os.kill(pid, signal.SIGKILL)
        assert not left, f"child processes {left} outlived the server:\n{self.log()[-3000:]}"
        return rc

    def kill(self) -> None:
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def greedy(max_new_tokens: int = 16, **extra) -> dict:
    return {"temperature": 0, "max_new_tokens": max_new_tokens, **extra}


def endless(**extra) -> dict:
    """Sampling params of a request that outlasts any test (on a server started with ENDLESS_ARGS)."""
    return greedy(ENDLESS_TOKENS, ignore_eos=True, **extra)


def sse_events(client: httpx.Client, body: dict) -> list:
    """POST a streaming /generate; returns the decoded events, the str "[DONE]" included."""
    import json

    events: list = []
    with client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def assert_pool_free_after_flush(client: httpx.Client, idle_timeout_s: float = 30.0) -> dict:
    """Idle, ``/flush_cache`` succeeds, and every KV token is free again (no page or slot leaked)."""
    wait_idle(client, timeout_s=idle_timeout_s)
    resp = client.post("/flush_cache")
    assert resp.status_code == 200, resp.text
    state = client.get("/get_server_info").json()["internal_state"]
    assert state["available_size"] == state["max_total_num_tokens"], state
    assert state["evictable_size"] == 0 and state["protected_size"] == 0, state
    return state


def wait_idle(client: httpx.Client, timeout_s: float = 10.0) -> dict:
    """Poll /get_server_info until no request is running or queued; returns its internal state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = client.get("/get_server_info").json()["internal_states"][0]
        if state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"scheduler still busy after {timeout_s} s: {state}")
        time.sleep(0.1)
