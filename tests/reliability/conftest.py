"""Fixtures and checks of the reliability suite: real servers (``tests/server/helpers.py``), the
idle-pool check, the "leak" log check and per-process RSS."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.server.conftest import launch  # noqa: F401  (the same server factory fixture)
from tests.server.helpers import ServerProcess, assert_pool_free_after_flush, descendants  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
CHAT_TEMPLATE = str(Path(__file__).with_name("chatml.jinja"))  # stories260K has no chat template of its own


def app_routes(http: httpx.Client) -> set[str]:
    return set(http.get("/openapi.json").json()["paths"])


def assert_clean_log(server: ServerProcess) -> None:
    """No leak report, no internal error, no traceback in the server's log."""
    lines = server.log().splitlines()
    bad = [i for i, line in enumerate(lines)
           if "leak" in line.lower() or "Traceback" in line or "internal error" in line]
    # the first bad line with what follows it (a traceback), then the log's tail
    assert not bad, "\n".join(lines[bad[0]:bad[0] + 60]) + "\n---\n" + "\n".join(lines[-40:])


def rss_mb(pid: int) -> float:
    """VmRSS of one process in MiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_rss(server: ServerProcess) -> dict[int, float]:
    """RSS (MiB) of the launcher and each of its descendants (scheduler, detokenizer, ...)."""
    return {pid: rss_mb(pid) for pid in [server.proc.pid, *descendants(server.proc.pid)]}
