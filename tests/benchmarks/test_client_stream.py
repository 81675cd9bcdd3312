"""bench_serving's streaming client (aiohttp) against a scripted SSE server: long events, an HTTP error,
an in-band error, a stream cut before ``[DONE]``, and a server that is not there. Each request ends with
one outcome and a message, as the suite's tables report it."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket

import pytest
from aiohttp import web

LONG = "x" * 200_000  # one SSE line far past aiohttp's default 64 KiB read buffer


def _event(text: str, n: int) -> bytes:
    return b"data: " + json.dumps({"text": text, "meta_info": {"completion_tokens": n, "prompt_tokens": 3}}).encode() \
        + b"\n\n"


async def _generate(request: web.Request) -> web.StreamResponse:
    mode = (await request.json())["text"]
    if mode == "status":
        return web.Response(status=503, text="overloaded")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if mode == "long":
        await resp.write(_event(LONG, 1))
        await resp.write(_event(LONG + "y", 2))
    elif mode == "in-band":
        await resp.write(_event("a", 1))
        await resp.write(b'data: {"error": {"message": "bad schema", "code": 400}}\n\n')
    elif mode == "cut":
        await resp.write(_event("a", 1))
        request.transport.close()  # the server goes away mid-stream
        return resp
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _send_all(bench, modes: list[str], url: str | None = None) -> list:
    app = web.Application()
    app.router.add_post("/generate", _generate)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    args = argparse.Namespace(temperature=0.0)
    target = bench.Target("fake", url or f"http://127.0.0.1:{port}", "radixlm")
    try:
        async with bench.client_session(30.0, {}) as client:
            return [await bench.send_request(client, target, bench.BenchRequest(prompt=m, prompt_len=3, output_len=2),
                                             m, args, None) for m in modes]
    finally:
        await runner.cleanup()


def test_long_events_are_read_whole(bench):
    (o,) = asyncio.run(_send_all(bench, ["long"]))
    assert o.success and o.error == ""
    assert o.text == LONG + "y" and o.output_len == 2 and o.prompt_len == 3
    assert o.ttft > 0 and len(o.itl) == 1 and o.latency >= o.ttft


@pytest.mark.parametrize("mode, message", [("status", "HTTP 503: b'overloaded'"), ("in-band", "bad schema"),
                                           ("cut", "ClientPayloadError")])
def test_a_failed_stream_is_one_failed_request_with_its_reason(bench, mode, message):
    (o,) = asyncio.run(_send_all(bench, [mode]))
    assert not o.success
    assert message in o.error


def test_an_unreachable_server_fails_the_request_not_the_run(bench):
    (o,) = asyncio.run(_send_all(bench, ["long"], url=f"http://127.0.0.1:{_free_port()}"))
    assert not o.success and "ClientConnectorError" in o.error
