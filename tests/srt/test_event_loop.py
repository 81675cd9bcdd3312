"""The HTTP process's event loop: uvloop (a dependency on Linux and macOS), as SGLang's server runs."""

from __future__ import annotations

import asyncio
import sys

import pytest

from radixlm.srt.launch_server import _event_loop_factory


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not a dependency on Windows")
def test_the_server_loop_is_uvloop():
    import uvloop

    factory = _event_loop_factory()
    assert factory is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        async def loop_type():
            await asyncio.sleep(0)
            return type(asyncio.get_running_loop())

        assert issubclass(runner.run(loop_type()), uvloop.Loop)
