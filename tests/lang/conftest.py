"""Live servers for the frontend tests, launched with ``radixlm.lang.Runtime`` once per session.

``stories`` (stories260K, for mechanics) and ``smollm2`` (the demo model, where words must mean
something) are RuntimeEndpoints. Whichever server is needed first also starts the other one in
the background when the session's tests will need it, so their start-up times overlap.
"""

from __future__ import annotations

import pytest

import radixlm.lang as rl

SERVER_ARGS = {"max_total_tokens": 20000, "log_level": "warning"}


def pytest_configure(config):
    config.addinivalue_line("markers", "compat: drives our server with the real sglang frontend (needs sglang)")


class _Servers:
    """Launches runtimes without waiting, waits on first use, shuts all down at the end."""

    def __init__(self, stories_path: str):
        self.paths = {"stories": stories_path, "smollm2": None}
        self.runtimes: dict[str, rl.Runtime] = {}

    def start(self, name: str) -> None:
        if name not in self.runtimes:
            self.runtimes[name] = rl.Runtime(self.paths[name], wait=False, **SERVER_ARGS)

    def get(self, name: str) -> rl.Runtime:
        self.start(name)
        runtime = self.runtimes[name]
        runtime.wait_ready()
        return runtime

    def shutdown(self) -> list[tuple[str, int]]:
        codes = []
        for name, runtime in self.runtimes.items():
            runtime.shutdown()
            codes.append((name, runtime.process.returncode))
        return codes


@pytest.fixture(scope="session")
def lang_servers(request, stories_path):
    servers = _Servers(stories_path)
    wanted = {name for item in request.session.items for name in ("stories", "smollm2")
              if name in getattr(item, "fixturenames", ())}
    for name in sorted(wanted):
        servers.start(name)
    yield servers
    codes = servers.shutdown()
    assert all(code == 0 for _, code in codes), f"servers did not exit cleanly: {codes}"


@pytest.fixture(scope="session")
def stories_runtime(lang_servers) -> rl.Runtime:
    return lang_servers.get("stories")


@pytest.fixture(scope="session")
def smollm2_runtime(lang_servers) -> rl.Runtime:
    return lang_servers.get("smollm2")


@pytest.fixture(scope="session")
def stories(stories_runtime) -> rl.RuntimeEndpoint:
    return stories_runtime.endpoint


@pytest.fixture(scope="session")
def smollm2(smollm2_runtime) -> rl.RuntimeEndpoint:
    return smollm2_runtime.endpoint


def regex_supported(endpoint: rl.RuntimeEndpoint) -> bool:
    """Whether the server enforces ``regex`` (some builds accept the field and ignore it)."""
    import re

    try:
        out = endpoint.request({"text": "The number is", "sampling_params":
                                {"max_new_tokens": 3, "temperature": 0, "regex": "[0-9]{3}"}})
    except rl.BackendError:
        return False
    return re.fullmatch("[0-9]{3}", out["text"]) is not None


def require_regex(endpoint: rl.RuntimeEndpoint) -> None:
    if not regex_supported(endpoint):
        pytest.skip("the server does not enforce regex constraints yet")
