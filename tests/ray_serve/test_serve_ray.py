"""``radixlm serve-ray`` on a local Ray: 2 replicas of stories260K behind Ray Serve's ingress answer
/generate (plain and streamed) and /v1/chat/completions exactly as the plain server does, bad input
is the same 400, a repeated prefix goes to the replica that holds it (which then reports cached
tokens) and a new one to the other replica; SIGTERM tears everything down. Skipped without Ray."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from tests.conftest import STORY_PROMPTS  # noqa: E402
from tests.server.helpers import BASE_ARGS, ServerProcess, greedy, sse_events  # noqa: E402

SERVE_RAY = [sys.executable, "-m", "radixlm.cli", "serve-ray"]
REPLICA = "x-radixlm-replica"
# stories260K has no chat template of its own.
CHAT_TEMPLATE = str(Path(__file__).parents[1] / "reliability" / "chatml.jinja")

pytestmark = pytest.mark.slow  # a local Ray cluster and two replicas: about a minute on 2 cores


@pytest.fixture(scope="module")
def plain(launch, stories_path) -> ServerProcess:
    return launch(["--model-path", stories_path, *BASE_ARGS, "--cpu-threads", "1", "--chat-template", CHAT_TEMPLATE])


@pytest.fixture(scope="module")
def ray_app(stories_path):
    app = ServerProcess.start(["--model-path", stories_path, *BASE_ARGS, "--chat-template", CHAT_TEMPLATE,
                               "--num-replicas", "2"],
                              command=SERVE_RAY, timeout_s=400)
    yield app
    if app.proc.poll() is None:
        assert app.stop(timeout_s=90) == 0, app.log()[-4000:]


def test_generate_and_chat_equal_the_plain_server(ray_app, plain):
    sp = greedy(16, min_new_tokens=16)
    with ray_app.client() as ray_http, plain.client() as http:
        for prompt in STORY_PROMPTS[:4]:
            body = {"text": prompt, "sampling_params": sp}
            got, want = ray_http.post("/generate", json=body), http.post("/generate", json=body)
            assert got.status_code == 200, got.text
            assert got.json()["output_ids"] == want.json()["output_ids"]
            assert got.json()["text"] == want.json()["text"]
        batch = {"text": STORY_PROMPTS[4:7], "sampling_params": sp}
        assert ([o["output_ids"] for o in ray_http.post("/generate", json=batch).json()]
                == [o["output_ids"] for o in http.post("/generate", json=batch).json()])
        events = sse_events(ray_http, {"text": STORY_PROMPTS[7], "sampling_params": sp})
        plain_events = sse_events(http, {"text": STORY_PROMPTS[7], "sampling_params": sp})
        assert events[-1] == "[DONE]" and len(events) == len(plain_events)
        assert events[-2]["text"] == plain_events[-2]["text"]
        assert events[-2]["meta_info"]["finish_reason"] == plain_events[-2]["meta_info"]["finish_reason"]
        chat = {"model": "default", "messages": [{"role": "user", "content": "Once upon a time"}],
                "max_tokens": 12, "temperature": 0}
        got, want = ray_http.post("/v1/chat/completions", json=chat), http.post("/v1/chat/completions", json=chat)
        assert got.status_code == 200, got.text
        assert got.json()["choices"][0]["message"] == want.json()["choices"][0]["message"]
        assert got.json()["usage"] == want.json()["usage"]


def test_bad_input_is_the_plain_servers_400(ray_app, plain):
    with ray_app.client() as ray_http, plain.client() as http:
        for path, body in (("/generate", {"sampling_params": greedy(4)}),
                           ("/v1/chat/completions", {"model": "default", "messages": []})):
            got, want = ray_http.post(path, json=body), http.post(path, json=body)
            assert got.status_code == want.status_code == 400
            assert got.json() == want.json()
        assert ray_http.get("/health").status_code == 200
        assert ray_http.get("/no_such_route").status_code == 404


def test_a_repeated_prefix_goes_to_the_replica_that_has_it(ray_app):
    shared = STORY_PROMPTS[6]  # the longest prompt
    with ray_app.client() as http:
        replicas, cached = [], []
        for i in range(4):
            r = http.post("/generate", json={"text": shared + f" {i}", "sampling_params": greedy(4)})
            assert r.status_code == 200, r.text
            replicas.append(r.headers[REPLICA])
            cached.append(r.json()["meta_info"]["cached_tokens"])
        assert len(set(replicas)) == 1, replicas
        assert all(c >= 20 for c in cached[1:]), cached  # the shared prompt's KV was reused
        # No prefix in common: the router sends it to the replica that has seen the least.
        other = http.post("/generate", json={"text": "Lily", "sampling_params": greedy(4)})
        assert other.status_code == 200
        assert other.headers[REPLICA] != replicas[0]
