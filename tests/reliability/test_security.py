"""Security of a running server (stories260K):

- ``--api-key``: every route of ``/openapi.json`` plus the routes outside the schema (``/openapi.json``,
  ``/docs``, ``/redoc``, ...), with every HTTP method, answers 401 without the key, with a wrong key and
  with the key not sent as ``Bearer`` (OpenAI's error shape under ``/v1/``, the native one elsewhere);
  with the key it is never 401, the scheme in any case (RFC 7235). ``/health*`` and ``/metrics`` need no key (as SGLang's).
- Prompts and outputs stay out of the server log by default (a request with a unique marker, on
  every generation route, streaming or not, and in rejected requests); ``--log-requests`` logs them.
- The server binds 127.0.0.1 unless ``--host`` says otherwise: the listening socket of a server
  started without ``--host`` is loopback only, and a non-loopback local address refuses connections.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import time
from pathlib import Path

import httpx
import pytest

from radixlm.srt.server_args import ServerArgs

from .conftest import CHAT_TEMPLATE, assert_pool_free_after_flush

KEY = f"sk-security-{secrets.token_hex(8)}"
# Outside /openapi.json: FastAPI's own documentation routes (GET and HEAD).
NON_SCHEMA_ROUTES = {"/openapi.json": ["GET", "HEAD"], "/docs": ["GET", "HEAD"],
                     "/docs/oauth2-redirect": ["GET", "HEAD"], "/redoc": ["GET", "HEAD"]}
ALL_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
PATH_PARAM_VALUES = {"model_id": "stories260k", "response_id": "resp_none"}
SERVER_ARGS = ["--max-total-tokens", "3000", "--context-length", "256", "--chat-template", CHAT_TEMPLATE,
               "--served-model-name", "stories260k", "--log-level", "info"]


@pytest.fixture(scope="module")
def keyed(launch, stories_path):
    """``--api-key``, requests not logged (the default)."""
    return launch(["--model-path", stories_path, "--api-key", KEY, *SERVER_ARGS], api_key=KEY)


@pytest.fixture(scope="module")
def logging_server(launch, stories_path):
    """``--log-requests``, started without ``--host`` (the default bind address)."""
    return launch(["--model-path", stories_path, "--log-requests", *SERVER_ARGS], host=None)


def _routes(keyed) -> dict[str, list[str]]:
    """path -> methods: the schema's operations (path parameters filled in) and NON_SCHEMA_ROUTES."""
    with keyed.client() as http:
        spec = http.get("/openapi.json").json()
    routes = {path.format(**PATH_PARAM_VALUES): [m.upper() for m in ops] for path, ops in spec["paths"].items()}
    assert {"/generate", "/v1/completions", "/v1/chat/completions", "/metrics", "/flush_cache"} <= set(routes)
    return {**routes, **NON_SCHEMA_ROUTES}


def _assert_401(resp: httpx.Response, path: str, method: str) -> None:
    assert resp.status_code == 401, (method, path, resp.status_code, resp.text[:300])
    err = resp.json()["error"]
    if path.startswith("/v1/"):
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_api_key", err
    else:
        assert set(err) == {"message", "type", "code"} and err["code"] == 401, err
    assert err["type"] == "authentication_error" and KEY not in resp.text


BAD_AUTH = {"none": {}, "wrong": {"Authorization": "Bearer wrong-key"}, "no-bearer": {"Authorization": KEY},
            "prefix": {"Authorization": f"Bearer {KEY[:-1]}"}, "basic": {"Authorization": f"Basic {KEY}"},
            "lowercase-scheme": {"Authorization": f"bearer {KEY}x"}}


def test_every_route_and_method_needs_the_key(keyed):
    routes = _routes(keyed)
    checked = 0
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        for path in routes:
            for method in ALL_METHODS:
                if path.startswith(("/health", "/metrics")):  # open, as SGLang's (test below)
                    continue
                for headers in BAD_AUTH.values():
                    resp = http.request(method, path, headers=headers, json={} if method in ("POST", "PUT") else None)
                    if method == "HEAD":
                        assert resp.status_code == 401, (method, path, resp.status_code)
                    else:
                        _assert_401(resp, path, method)
                    checked += 1
    closed = [p for p in routes if not p.startswith(("/health", "/metrics"))]
    assert len(closed) >= len(routes) - 3 and checked == len(closed) * len(ALL_METHODS) * len(BAD_AUTH)


def test_with_the_key_no_route_is_401(keyed):
    with keyed.client(timeout=60) as http:
        for path, methods in _routes(keyed).items():
            for method in methods:
                body = {} if method in ("POST", "PUT") else None  # cheap: generation routes answer 400
                resp = http.request(method, path, json=body)
                assert resp.status_code != 401, (method, path, resp.text[:300])
                assert resp.status_code < 500, (method, path, resp.text[:300])
        assert http.get("/docs").status_code == 200 and http.get("/openapi.json").status_code == 200


def test_the_scheme_is_case_insensitive(keyed):
    """RFC 7235 2.1: ``bearer KEY`` and ``BEARER KEY`` are ``Bearer KEY`` (a wrong key in any case is 401)."""
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        for scheme in ("bearer", "BEARER", "Bearer"):
            assert http.get("/get_model_info", headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200
            assert http.get("/v1/models", headers={"Authorization": f"{scheme}  {KEY}"}).status_code == 200
            _assert_401(http.get("/v1/models", headers={"Authorization": f"{scheme} {KEY}x"}), "/v1/models", "GET")
        _assert_401(http.get("/v1/models", headers={"Authorization": f"Bearer{KEY}"}), "/v1/models", "GET")


def test_probes_and_metrics_need_no_key(keyed):
    """SGLang's API-key middleware lets ``/health*`` and ``/metrics*`` through: probes and scrapers
    carry no secret."""
    for path in ("/health", "/health_generate", "/metrics"):
        for headers in ({}, BAD_AUTH["wrong"]):
            resp = httpx.get(keyed.url + path, headers=headers, timeout=60)
            assert resp.status_code == 200, (path, resp.status_code, resp.text[:200])
    assert "radixlm:num_requests_total" in httpx.get(keyed.url + "/metrics", timeout=10).text
    assert httpx.get(keyed.url + "/get_model_info", timeout=10).status_code == 401


def test_key_is_never_echoed(keyed):
    with keyed.client() as http:
        info = http.get("/get_server_info").json()
    assert "api_key" not in info and KEY not in str(info)
    assert KEY not in keyed.log()


# ---- prompts and outputs in the log -------------------------------------------------------------------
def _marker() -> str:
    return f"Quokka{secrets.randbelow(10 ** 8):08d}"


def _send_marked_requests(http: httpx.Client, marker: str) -> list[str]:
    """Greedy requests whose prompt holds ``marker`` on every generation route, streaming and not, and
    requests rejected because of a field that holds it; returns the generated texts."""
    prompt = f"Once upon a time {marker} went to the park"
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    outputs = []
    resp = http.post("/generate", json={"text": prompt, "sampling_params": sp})
    assert resp.status_code == 200, resp.text
    outputs.append(resp.json()["text"])
    resp = http.post("/generate", json={"text": prompt, "sampling_params": sp, "stream": True})
    assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]"), resp.text[-300:]
    resp = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0})
    assert resp.status_code == 200, resp.text
    outputs.append(resp.json()["choices"][0]["text"])
    resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}],
                                                   "max_tokens": 24, "temperature": 0, "stream": True})
    assert resp.status_code == 200, resp.text
    rejected = [{"text": prompt, "sampling_params": {"regex": f"({marker}"}},
                {"text": prompt, "sampling_params": {"json_schema": f'{{"type": "{marker}"}}'}},
                {"text": prompt, "sampling_params": {"stop": [marker], "max_new_tokens": 10 ** 6}},
                {"text": prompt, marker: 1}]
    for body in rejected:
        resp = http.post("/generate", json=body)
        assert 400 <= resp.status_code < 500 or resp.json()["meta_info"]["finish_reason"]["type"] == "abort", resp.text
    return [o for o in outputs if len(o.strip()) >= 12]  # long enough not to occur in the log by chance


def _wait_for_log(server, needle: str, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle in server.log():
            return True
        time.sleep(0.1)
    return False


def test_prompts_and_outputs_are_not_logged_by_default(keyed):
    marker = _marker()
    with keyed.client(timeout=60) as http:
        outputs = _send_marked_requests(http, marker)
        assert_pool_free_after_flush(http)
    assert outputs, "no output long enough to look for"
    time.sleep(0.5)  # let the child processes' last lines reach the log
    log = keyed.log()
    assert marker not in log, [line for line in log.splitlines() if marker in line][:5]
    for text in outputs:
        assert text not in log, text


def test_log_requests_logs_prompts_and_outputs(logging_server):
    marker = _marker()
    with logging_server.client(timeout=60) as http:
        outputs = _send_marked_requests(http, marker)
    assert _wait_for_log(logging_server, marker)
    lines = logging_server.log().splitlines()
    assert any("Receive:" in line and marker in line and "max_new_tokens" in line for line in lines)
    finished = "\n".join(line for line in lines if "Finish:" in line)
    for text in outputs:
        assert repr(text)[1:-1] in finished, text


# ---- bind address ---------------------------------------------------------------------------------------
def _listening_addresses(port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Local addresses of the TCP sockets in LISTEN state on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            hex_addr, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(hex_addr)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append(ipaddress.ip_address(raw))
    return found


def _non_loopback_local_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (the default route's), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # UDP: picks the outgoing interface, sends nothing
            addr = s.getsockname()[0]
        except OSError:
            addr = None
    if addr is None or ipaddress.ip_address(addr).is_loopback or ipaddress.ip_address(addr).is_unspecified:
        return None
    return addr


def test_default_bind_address_is_loopback(logging_server):
    assert ServerArgs().host == "127.0.0.1"
    addresses = _listening_addresses(logging_server.port)
    if not addresses and not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp to inspect")
    assert addresses and all(a.is_loopback for a in addresses), addresses


def test_non_loopback_address_refuses(logging_server):
    addr = _non_loopback_local_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    with pytest.raises(OSError):
        socket.create_connection((addr, logging_server.port), timeout=3).close()
