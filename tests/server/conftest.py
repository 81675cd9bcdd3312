"""Fixtures for the server tests: real server launches (see ``helpers.py``): ``launch`` for a module's
own servers, ``server_pool`` for default-settings servers that modules share."""

from __future__ import annotations

import os
from typing import Optional

import pytest

from .helpers import BASE_ARGS, ENDLESS_ARGS, START_TIMEOUT_S, ServerProcess


@pytest.fixture(scope="module")
def launch():
    """Factory: ``launch(args, command=None, api_key=None, timeout_s=..., host="127.0.0.1") ->
    ServerProcess`` (``host=None``: the server's default bind address); every server still running
    at the end of the module is stopped and must exit cleanly. The reliability suite reuses it."""
    started: list[ServerProcess] = []

    def _launch(args: list[str], command: Optional[list[str]] = None, api_key: Optional[str] = None,
                timeout_s: float = START_TIMEOUT_S, host: Optional[str] = "127.0.0.1") -> ServerProcess:
        server = ServerProcess.start(args, command=command, api_key=api_key, timeout_s=timeout_s, host=host)
        started.append(server)
        return server

    yield _launch
    for server in started:
        if server.proc.poll() is None:
            assert server.stop() == 0, server.log()[-3000:]
        os.unlink(server.log_path)


@pytest.fixture(scope="session")
def server_pool():
    """Factory: ``server_pool(args) -> ServerProcess``, one server per distinct argument list for the
    whole session, started on first use. Only for tests that need *a* server with those settings,
    not a fresh one: they take counters as deltas and flush before checking the cache, and never
    stop, kill or signal it (those use ``launch``). Each must still be alive when asked for again,
    and exit cleanly, no child left, at the end of the session."""
    servers: dict[tuple[str, ...], ServerProcess] = {}

    def _get(args: list[str]) -> ServerProcess:
        key = tuple(args)
        server = servers.get(key)
        if server is None:
            server = servers[key] = ServerProcess.start(args)
        elif server.proc.poll() is not None:
            raise RuntimeError(f"the shared server {args} exited ({server.proc.returncode}):\n{server.log()[-3000:]}")
        return server

    yield _get
    for server in servers.values():
        try:
            assert server.stop() == 0, server.log()[-3000:]
        finally:
            os.unlink(server.log_path)


@pytest.fixture(scope="module")
def server(server_pool, stories_path) -> ServerProcess:
    """A stories260K server with default settings, shared by the modules that use it (``server_pool``)."""
    return server_pool(["--model-path", stories_path, *BASE_ARGS])


@pytest.fixture(scope="module")
def endless_server(launch, stories_path) -> ServerProcess:
    """Default settings but ENDLESS_ARGS: for tests that need a request still running (``endless()``)."""
    return launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS])


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


