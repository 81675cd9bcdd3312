"""Faults: a child process killed under load, and startup failures through the real CLI.

A dead detokenizer (like a dead scheduler, ``tests/server/test_lifecycle.py``) makes the server exit
non-zero within 5 s, names the cause in the log and leaves no process behind. A model that does not
exist or is corrupt, or a GGUF cache that cannot be written, makes ``radixlm serve`` print one line
``radixlm: error: ...`` on stderr and exit 1, with no traceback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import STORIES_GGUF
from tests.server.helpers import BASE_ARGS, ENDLESS_ARGS, ServerProcess, endless, free_port, pid_alive

EXIT_WITHIN_S = 5.0
CLI_TIMEOUT_S = 180


def _streams_in_background(server: ServerProcess, count: int) -> threading.Event:
    """Start ``count`` long streaming requests; the event is set once one of them got an event."""
    started = threading.Event()

    def run(i: int) -> None:
        try:
            with server.client(timeout=60) as c:
                body = {"text": f"Lily {i}", "stream": True, "sampling_params": endless()}
                with c.stream("POST", "/generate", json=body) as resp:
                    for _ in resp.iter_lines():
                        started.set()
        except httpx.HTTPError:
            pass  # the server went away under us, as intended

    for i in range(count):
        threading.Thread(target=run, args=(i,), daemon=True).start()
    return started


def test_killed_detokenizer_makes_the_server_exit_nonzero(launch, stories_path):
    server = launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS])
    assert _streams_in_background(server, 4).wait(60)
    detokenizer = server.child_pid("detokenizer")
    os.kill(detokenizer, signal.SIGKILL)
    killed_at = time.monotonic()
    rc = server.wait_exit(15)
    assert time.monotonic() - killed_at < EXIT_WITHIN_S, server.log()[-3000:]
    assert rc != 0
    log = server.log()
    assert "the detokenizer process died (exit code -9)" in log, log[-3000:]
    deadline = time.monotonic() + 3
    while any(pid_alive(p) for p in server.known_children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in server.known_children if pid_alive(p)], "orphan processes"


# ---- startup failures through ``radixlm serve`` --------------------------------------------------
def _serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``radixlm serve ARGS`` (the console script's ``main``) to its exit."""
    command = [sys.executable, "-c", "import sys; from radixlm.cli import main; sys.exit(main())",
               "serve", "--host", "127.0.0.1", "--port", str(free_port()), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def _assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit status 1, no traceback, and exactly one ``radixlm: error:`` line holding ``fragments``."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("radixlm: error: ")]
    assert len(lines) == 1, out[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _hf_copy(src: str, dst: Path) -> Path:
    """A writable copy of an HF model folder."""
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    return dst


def test_context_length_beyond_the_models_is_refused_in_one_line(stories_path):
    """As SGLang: --context-length past max_position_embeddings needs the operator's explicit switch."""
    env = {"RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": ""}
    proc = _serve("--model-path", stories_path, "--context-length", "5000", env=env)
    _assert_one_line_error(proc, "context_length 5000 is longer than the model's own context (2048 tokens",
                           "RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    assert "started scheduler process" not in proc.stderr  # refused before any process starts


def test_model_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-such-model"
    _assert_one_line_error(_serve("--model-path", str(missing)), str(missing), "does not exist")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_safetensors(tmp_path, stories_path, damage):
    folder = _hf_copy(stories_path, tmp_path / "model")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(64 << 10))
    _assert_one_line_error(_serve("--model-path", str(folder)), "model.safetensors")


def test_safetensors_missing_a_weight_fails_in_the_scheduler_with_one_line(tmp_path, stories_path):
    """A well-formed file without one of the model's tensors: found only when the scheduler process
    loads the weights, and reported by the launcher from the child's ready pipe."""
    from safetensors.torch import load_file, save_file

    folder = _hf_copy(stories_path, tmp_path / "model")
    state = load_file(str(folder / "model.safetensors"))
    dropped = sorted(k for k in state if k.endswith("mlp.down_proj.weight"))[0]
    del state[dropped]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _assert_one_line_error(_serve("--model-path", str(folder), *BASE_ARGS),
                           "scheduler process failed to start", "weights missing", dropped.removeprefix("model."))


@pytest.mark.parametrize("damage", ["garbage-after-magic", "truncated"])
def test_corrupt_gguf(tmp_path, damage):
    bad = tmp_path / "model.gguf"
    data = STORIES_GGUF.read_bytes()
    bad.write_bytes(b"GGUF" + os.urandom(8192) if damage == "garbage-after-magic" else data[: len(data) // 2])
    _assert_one_line_error(_serve("--model-path", str(bad), "--cache-dir", str(tmp_path / "cache")),
                           str(bad))


def test_gguf_cache_dir_under_a_regular_file(tmp_path):
    """A cache dir that cannot be created (its parent is a file: stops root too)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    _assert_one_line_error(_serve("--model-path", str(STORIES_GGUF), "--cache-dir", str(blocker / "cache")),
                           "GGUF cache")


def test_gguf_cache_lock_that_cannot_be_created(tmp_path):
    """The cache folder exists but its lock file cannot be opened (a folder in its place: stops
    root too): the same one-line error as a read-only folder."""
    import hashlib

    stem = f"{STORIES_GGUF.stem}-{hashlib.sha256(STORIES_GGUF.read_bytes()).hexdigest()[:16]}"
    (tmp_path / "cache" / "gguf" / f"{stem}.lock").mkdir(parents=True)
    _assert_one_line_error(_serve("--model-path", str(STORIES_GGUF), "--cache-dir", str(tmp_path / "cache")),
                           "cannot write to the GGUF cache folder")


def test_gguf_cache_dir_read_only_via_env(tmp_path):
    """``$RADIXLM_CACHE_DIR`` an existing read-only folder: the conversion cannot write there."""
    if os.geteuid() == 0:
        pytest.skip("running as root: a read-only mode does not stop root's writes "
                    "(test_gguf_cache_dir_under_a_regular_file covers the unwritable cache as root)")
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        _assert_one_line_error(_serve("--model-path", str(STORIES_GGUF), env={"RADIXLM_CACHE_DIR": str(cache)}),
                               "GGUF cache")
    finally:
        cache.chmod(0o755)


def test_scheduler_startup_error_is_one_line():
    """An error raised while the scheduler process sets up (flashinfer on a CPU device)."""
    proc = _serve("--model-path", str(Path(STORIES_GGUF).parents[1] / "stories260k-hf"), "--device", "cpu",
                  "--attention-backend", "flashinfer", *BASE_ARGS)
    _assert_one_line_error(proc, "scheduler process failed to start",
                           "the flashinfer attention backend needs --device cuda")


def test_missing_chat_template_file(tmp_path, stories_path):
    missing = tmp_path / "no-template.jinja"
    _assert_one_line_error(_serve("--model-path", stories_path, "--chat-template", str(missing)),
                           f"--chat-template {missing}", "No such file")


def test_bad_flag_is_a_usage_error():
    proc = _serve("--max-running-requests", "0")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--max-running-requests must be >= 1" in proc.stderr
