"""Process lifecycle: startup errors, a dying child, SIGTERM / Ctrl-C with requests in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from .helpers import BASE_ARGS, ENDLESS_ARGS, ServerProcess, descendants, endless, free_port, greedy, pid_alive


def _stream_in_background(server: ServerProcess) -> threading.Event:
    """Start a long streaming request; the returned event is set once its first event arrived."""
    started = threading.Event()

    def run() -> None:
        try:
            with server.client(timeout=60) as c:
                body = {"text": "Lily", "stream": True, "sampling_params": endless()}
                with c.stream("POST", "/generate", json=body) as resp:
                    for _ in resp.iter_lines():
                        started.set()
        except httpx.HTTPError:
            pass  # the server went away under us, as intended

    threading.Thread(target=run, daemon=True).start()
    return started


@pytest.mark.parametrize("sig,group", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True)],
                         ids=["SIGTERM", "SIGINT", "Ctrl-C-to-the-group"])
def test_first_signal_drains_the_second_stops_everything_quickly(launch, stories_path, sig, group):
    """As SGLang: the first signal lets open requests finish (new ones, and /health, get 503); a
    second one (Ctrl-C twice) stops at once. A terminal's Ctrl-C reaches every process of the group:
    the children leave it to the launcher (they used to stop at once, failing every open request)."""
    server = launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS])
    children = descendants(server.proc.pid)
    assert len(children) >= 2  # scheduler + detokenizer (+ multiprocessing's resource tracker)
    assert _stream_in_background(server).wait(60)

    def send() -> None:
        for pid in [server.proc.pid, *(children if group else [])]:
            if pid_alive(pid):
                os.kill(pid, sig)

    send()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        deadline = time.monotonic() + 10
        while http.get("/health").status_code == 200:  # the watchdog notices within 0.5 s
            assert time.monotonic() < deadline
            time.sleep(0.1)
        health = http.get("/health")
        assert health.status_code == 503 and "shutting down" in health.json()["error"]["message"]
        refused = http.post("/generate", json={"text": "Lily", "sampling_params": {"max_new_tokens": 2}})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
        time.sleep(1.0)
        assert server.proc.poll() is None, "the open stream holds the shutdown"
        assert http.get("/get_server_info").status_code == 200  # the scheduler still answers
    start = time.monotonic()
    send()
    assert server.wait_exit(15) == 0, server.log()[-3000:]
    assert time.monotonic() - start < 8.0
    deadline = time.monotonic() + 3
    while any(pid_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in children if pid_alive(p)]


def test_sigterm_lets_an_open_request_finish_then_exits(launch, stories_path):
    """A rolling deploy's SIGTERM: the request in flight gets its whole answer, then the server exits 0."""
    server = launch(["--model-path", stories_path, *BASE_ARGS])
    with server.client(timeout=60) as http:
        expected = http.post("/generate", json={"text": "Lily", "sampling_params": greedy(1500)}).json()
    result: dict = {}

    def run() -> None:
        with server.client(timeout=120) as c:
            result["resp"] = c.post("/generate", json={"text": "Lily", "sampling_params": greedy(1500)})

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    worker.join(120)
    resp = result["resp"]
    assert resp.status_code == 200 and resp.json()["output_ids"] == expected["output_ids"], resp.text[:300]
    assert resp.json()["meta_info"]["finish_reason"]["type"] == "length"
    assert server.wait_exit(15) == 0, server.log()[-3000:]
    assert "waiting for 1 open request(s) to finish" in server.log()


def test_shutdown_timeout_bounds_the_drain(launch, stories_path):
    server = launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS, "--shutdown-timeout", "1"])
    assert _stream_in_background(server).wait(60)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(15) == 0, server.log()[-3000:]
    assert 1.0 <= time.monotonic() - start < 8.0
    assert "stopping with 1 request(s) still open (--shutdown-timeout)" in server.log()


def test_killed_scheduler_makes_the_server_exit_nonzero(launch, stories_path):
    server = launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS])
    assert _stream_in_background(server).wait(60)
    scheduler = server.child_pid("scheduler")
    os.kill(scheduler, signal.SIGKILL)
    rc = server.wait_exit(15)
    assert rc != 0
    log = server.log()
    assert "the scheduler process died (exit code -9)" in log, log[-3000:]
    deadline = time.monotonic() + 3
    while any(pid_alive(p) for p in server.known_children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in server.known_children if pid_alive(p)]


def test_scheduler_error_during_startup_exits_nonzero_with_one_line(stories_path):
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "radixlm.srt.launch_server", "--model-path", stories_path, "--port", str(port),
         "--device", "cpu", "--attention-backend", "flashinfer", *BASE_ARGS],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert ("radixlm: error: scheduler process failed to start: the flashinfer attention backend needs "
            "--device cuda") in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr


def test_bad_model_path_and_bad_flags_fail_fast():
    bad_path = subprocess.run([sys.executable, "-m", "radixlm.srt.launch_server", "--model-path", "/nonexistent/model",
                               "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert bad_path.returncode == 1 and "/nonexistent/model does not exist" in bad_path.stderr
    bad_flag = subprocess.run([sys.executable, "-m", "radixlm.srt.launch_server", "--no-such-flag"],
                              capture_output=True, text=True, timeout=60)
    assert bad_flag.returncode == 2 and "--no-such-flag" in bad_flag.stderr
    bad_value = subprocess.run([sys.executable, "-m", "radixlm.srt.launch_server", "--page-size", "3"],
                               capture_output=True, text=True, timeout=60)
    assert bad_value.returncode == 2 and "--page-size must be a power of two" in bad_value.stderr


def test_children_exit_when_the_launcher_is_killed(launch, stories_path):
    server = launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS])
    children = [server.child_pid("scheduler"), server.child_pid("detokenizer")]
    assert _stream_in_background(server).wait(60)  # the scheduler is busy decoding
    # named for ps / top (srt/process_title.py), so `ps aux | grep radixlm` finds them
    titles = [open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode() for p in children]
    assert titles == ["radixlm::scheduler_TP0", "radixlm::detokenizer"], titles
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in children if pid_alive(p)], "children outlived a SIGKILLed launcher"
    ipc_dir = server.log().split("IPC sockets in ", 1)[1].split()[0]
    deadline = time.monotonic() + 3  # the scheduler removes it on its way out
    while os.path.exists(ipc_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(ipc_dir)


def test_port_in_use_fails_fast_with_one_line(stories_path):
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "radixlm.srt.launch_server", "--model-path", stories_path,
                               "--host", "127.0.0.1", "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout
    assert time.monotonic() - t0 < 60  # no model was loaded
