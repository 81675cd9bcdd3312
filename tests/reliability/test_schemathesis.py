"""Schemathesis against the server's own ``/openapi.json`` (``srt/openapi_spec.py``), stories260K with
``--api-key``.

Per operation, schemathesis generates valid and invalid requests from the schema and runs its
checks on each answer: no 5xx (``not_a_server_error``), a status and a content type the schema
declares, a body that matches the declared schema (``response_schema_conformance``; errors too),
declared headers present (``Retry-After`` on 503), schema-invalid requests rejected with a 4xx
(``negative_data_rejection``), 401 without the key (``ignored_auth``), 405 for undeclared methods.
On top: every 4xx is a JSON error body in our shape (native or OpenAI's); a ``HEAD``'s 4xx has the
JSON content type and no body. Afterwards the server
is healthy, idle, and ``/flush_cache`` frees the whole KV pool.

Not checked: ``positive_data_acceptance`` (every schema-valid request gets a 2xx). JSON Schema cannot
state all of the server's rules (a regex or grammar must compile, prompt + ``max_new_tokens`` must
fit the context, only one grammar per request, min <= max), so schema-valid bodies legitimately
get 400s.

The server keeps each request cheap: a 64-token context (the schema caps ``max_new_tokens`` at it).
Default suite: a few examples per operation; ``slow``: many more.
"""

from __future__ import annotations

import collections

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from schemathesis.config import SchemathesisConfig

from radixlm.srt.openapi_spec import OPERATIONS as OPERATIONS_DECLARED

from .conftest import CHAT_TEMPLATE, assert_clean_log, assert_pool_free_after_flush

KEY = "schemathesis-test-key"
CONTEXT_LEN = 64
STATUSES: collections.Counter = collections.Counter()  # (operation, status) -> count; printed with -s

@pytest.fixture(scope="module")
def server(launch, stories_path):
    return launch(["--model-path", stories_path, "--api-key", KEY, "--max-total-tokens", "4000",
                   "--context-length", str(CONTEXT_LEN), "--max-running-requests", "32",
                   "--chat-template", CHAT_TEMPLATE, "--served-model-name", "stories260k", "--log-level", "info"],
                  api_key=KEY)


@pytest.fixture(scope="module")
def api_schema(server):
    config = SchemathesisConfig.from_dict({
        "headers": {"Authorization": f"Bearer {KEY}"},
        "request-timeout": 60,
        "generation": {"deterministic": True, "database": "none"},
    })
    return schemathesis.openapi.from_url(server.url + "/openapi.json", config=config,
                                         headers={"Authorization": f"Bearer {KEY}"})


def check_error_body(case, response) -> None:
    """A 4xx carries our error object: OpenAI's under /v1/, the native one elsewhere."""
    STATUSES[(case.operation.label, response.status_code)] += 1
    if not 400 <= response.status_code < 500:
        return
    content_type = (response.headers.get("content-type") or [""])[0]  # schemathesis: a list per header
    assert content_type.startswith("application/json"), response.text[:300]
    if case.method.upper() == "HEAD":  # the GET's status and headers, no body (HTTP: a HEAD answer has none)
        assert response.content == b"", response.content[:300]
        return
    err = response.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    if case.operation.path.startswith("/v1/"):
        assert set(err) == {"message", "type", "param", "code"}, err
    else:
        assert set(err) == {"message", "type", "code"} and err["code"] == response.status_code, err


def run_case(case) -> None:
    response = case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=60)
    check_error_body(case, response)


# Every declared operation with schema-valid requests; those with a body with schema-invalid ones
# too (the others have nothing to make invalid).
CASES = [pytest.param(method.upper(), path, mode, id=f"{method.upper()} {path} {mode.value}")
         for path, methods in OPERATIONS_DECLARED.items() for method, op in methods.items()
         for mode in GenerationMode if mode is GenerationMode.POSITIVE or op.body is not None]


def fuzz_operation(api_schema, method: str, path: str, mode: GenerationMode, max_examples: int) -> None:
    """Run ``max_examples`` generated requests (``mode``: schema-valid or schema-invalid) of one
    operation through ``run_case`` (hypothesis, deterministic, no shrinking: each try is an HTTP call)."""
    operation = api_schema[path][method]

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        run_case(case)

    run()


@pytest.mark.parametrize("method, path, mode", CASES)
def test_api_conforms_to_its_schema(api_schema, method, path, mode):
    fuzz_operation(api_schema, method, path, mode, max_examples=8)


@pytest.mark.slow
@pytest.mark.parametrize("method, path, mode", CASES)
def test_api_conforms_to_its_schema_long(api_schema, method, path, mode):
    fuzz_operation(api_schema, method, path, mode, max_examples=100)


def test_after_schemathesis_the_server_is_healthy_and_nothing_leaked(server):
    """Runs last in this module."""
    print("schemathesis answers (operation, status) -> count:", dict(sorted(STATUSES.items())))
    with server.client(timeout=60) as http:
        assert http.get("/health").status_code == 200
        good = http.post("/generate", json={"text": "Lily", "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
        assert good.status_code == 200, good.text
        assert_pool_free_after_flush(http)
    assert_clean_log(server)
