"""bench_serving empties each server's prefix cache before a round: radixlm's / SGLang's ``/flush_cache``,
else vLLM's ``/reset_prefix_cache`` (retried while it answers ``success: false``), and says which one
worked; a server with neither is reported as not flushed (None), never as flushed."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _flush_against(bench, routes: dict) -> tuple:
    """routes: path -> list of (status, body) answered in turn (the last one repeats); returns the
    flush result and the number of calls each path got."""
    calls = {path: 0 for path in routes}

    def handler(path):
        async def h(request: web.Request) -> web.Response:
            answers = routes[path]
            status, body = answers[min(calls[path], len(answers) - 1)]
            calls[path] += 1
            return web.json_response(body, status=status) if isinstance(body, dict) else web.Response(status=status, text=body)
        return h

    app = web.Application()
    for path in routes:
        app.router.add_post(path, handler(path))
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with bench.client_session(30.0, {}) as client:
            return await bench.flush_prefix_cache(client, f"http://127.0.0.1:{port}", attempts=3), calls
    finally:
        await runner.cleanup()


def test_radixlm_route_first(bench):
    route, calls = asyncio.run(_flush_against(bench, {"/flush_cache": [(200, "Cache flushed.")],
                                                      "/reset_prefix_cache": [(200, {"success": True})]}))
    assert route == "/flush_cache" and calls == {"/flush_cache": 1, "/reset_prefix_cache": 0}


def test_vllm_reset_is_retried_until_it_succeeds(bench):
    route, calls = asyncio.run(_flush_against(bench, {"/reset_prefix_cache": [(200, {"success": False}),
                                                                              (200, {"success": True})]}))
    assert route == "/reset_prefix_cache" and calls["/reset_prefix_cache"] == 2


@pytest.mark.parametrize("routes", [
    {},  # llama-server: neither route
    {"/reset_prefix_cache": [(200, {"success": False})]},  # blocks held on every attempt
    {"/flush_cache": [(400, {"error": "requests running"})]},  # radixlm refusing while busy
])
def test_not_flushed_is_reported_as_none(bench, routes):
    route, calls = asyncio.run(_flush_against(bench, routes))
    assert route is None
    for path, n in calls.items():
        assert n == 3  # every attempt used before giving up
