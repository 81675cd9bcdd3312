"""Fixtures for the server tests: one real server launch per test module (see ``helpers.py``)."""

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


@pytest.fixture(scope="module")
def server(launch, stories_path) -> ServerProcess:
    """A stories260K server with default settings, shared by one test module."""
    return launch(["--model-path", stories_path, *BASE_ARGS])


@pytest.fixture(scope="module")
def endless_server(launch, stories_path) -> ServerProcess:
    """Default settings but ENDLESS_ARGS: for tests that need a request still running (``endless()``)."""
    return launch(["--model-path", stories_path, *BASE_ARGS, *ENDLESS_ARGS])


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


