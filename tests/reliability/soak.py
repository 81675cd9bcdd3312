"""The seeded mixed-load generator of the soak tests (``test_soak.py``) and its bookkeeping.

``make_jobs(n, seed, routes)`` draws the requests; ``run_load(url, jobs, concurrency, wave_size)``
sends them with asyncio + httpx (some clients disconnect at a random point, some requests are
aborted by rid through ``/abort_request``) and fills in each job's outcome. Load comes in waves
(bursts separated by a moment of idleness, as real traffic does): the scheduler turns optimistic
again whenever it idles, so each wave over-admits on a small pool and must retract, where one long
continuous burst retracts only until the scheduler's estimate has adapted; ``replay_alone(client, job)`` sends one
job, non-streaming, as the only request of a server whose cache was just flushed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from typing import Any, Optional

import httpx

from tests.conftest import STORY_PROMPTS

# Shared prefixes (the radix cache's case) followed by a story prompt.
PREFIXES = ["", "Once upon a time, in a small town, there lived a kind old man. ",
            "The sun was shining and the birds were singing in the big green park. ",
            "Tom and his sister Mia loved to play with their red ball every day after school. "]
REGEXES = [r"(yes|no|maybe)( [a-z]{1,6}){0,4}", r"[A-Z][a-z]{2,8} is [0-9]{1,2}"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@dataclasses.dataclass
class Job:
    idx: int
    api: str  # native | completions | chat
    path: str
    body: dict
    stream: bool
    greedy: bool
    n: int
    rid: str
    disconnect_after_s: Optional[float] = None  # the client goes away after this long
    abort_after_s: Optional[float] = None  # /abort_request {"rid": rid} after this long
    # outcome
    status: Optional[int] = None
    texts: Optional[list[str]] = None
    finish: Optional[list[str]] = None
    error: Optional[str] = None
    disconnected: bool = False
    latency_s: float = 0.0

    @property
    def aborted(self) -> bool:
        return bool(self.finish) and "abort" in self.finish  # type: ignore[operator]

    @property
    def comparable(self) -> bool:
        """A greedy request that ran to its natural end: its text must match the alone run."""
        return (self.greedy and not self.disconnected and self.status == 200 and self.error is None
                and not self.aborted and self.texts is not None)


def make_jobs(num: int, seed: int, routes: set[str], max_tokens: tuple[int, int] = (4, 24),
              ignore_eos_share: float = 0.5) -> list[Job]:
    """``num`` seeded jobs; ``max_tokens`` is the (min, max) output length drawn per request and
    ``ignore_eos_share`` the fraction that runs to that length (the memory pressure)."""
    rng = random.Random(seed)
    apis = ["native"] + [a for a, p in (("completions", "/v1/completions"), ("chat", "/v1/chat/completions"))
                         if p in routes]
    jobs = []
    for i in range(num):
        api = rng.choices(apis, weights=[60, 25, 15][:len(apis)])[0]
        prompt = rng.choice(PREFIXES) + rng.choice(STORY_PROMPTS)
        greedy = rng.random() < 0.75
        n = 2 if rng.random() < 0.15 else 1
        stream = rng.random() < 0.4
        max_new = rng.randint(*max_tokens)
        ignore_eos = rng.random() < ignore_eos_share  # long outputs: the memory pressure that forces retraction
        grammar: dict[str, Any] = {}
        r = rng.random()
        if r < 0.1:
            grammar = {"regex": rng.choice(REGEXES)}
        elif r < 0.2:
            grammar = {"json_schema": json.dumps(SCHEMA)}
        sampling: dict[str, Any] = {"temperature": 0} if greedy else {"temperature": 0.8}
        if not greedy and rng.random() < 0.5:
            sampling["seed" if api != "native" else "sampling_seed"] = rng.randint(0, 1000)
        rid = f"soak-{seed}-{i:05d}."  # no rid is a prefix of another (abort matches prefixes)
        if api == "native":
            params = {**sampling, "max_new_tokens": max_new, "ignore_eos": ignore_eos, "n": n, **grammar}
            body = {"text": prompt, "sampling_params": params, "rid": rid, "stream": stream}
            path = "/generate"
        elif api == "completions":
            body = {"prompt": prompt, "max_tokens": max_new, "n": n, "ignore_eos": ignore_eos, "rid": rid,
                    "stream": stream, **sampling, **grammar}
            path = "/v1/completions"
        else:
            if "json_schema" in grammar:
                grammar = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_new, "n": n,
                    "ignore_eos": ignore_eos, "rid": rid, "stream": stream, **sampling, **grammar}
            path = "/v1/chat/completions"
        job = Job(i, api, path, body, stream, greedy, n, rid)
        r = rng.random()
        if r < 0.2:
            job.disconnect_after_s = rng.uniform(0.02, 1.5)
        elif r < 0.27:
            job.abort_after_s = rng.uniform(0.02, 1.5)
        jobs.append(job)
    return jobs


# ---- answers -> texts --------------------------------------------------------------------------------
def _native_texts(obj: Any) -> tuple[list[str], list[str]]:
    items = obj if isinstance(obj, list) else [obj]
    return [o["text"] for o in items], [o["meta_info"]["finish_reason"]["type"] for o in items]


def _openai_texts(obj: dict, chat: bool) -> tuple[list[str], list[str]]:
    choices = sorted(obj["choices"], key=lambda c: c["index"])
    texts = [(c["message"]["content"] or "") if chat else c["text"] for c in choices]
    return texts, [c["finish_reason"] for c in choices]


def parse_response(job: Job, resp_json: Any) -> tuple[list[str], list[str]]:
    if job.api == "native":
        return _native_texts(resp_json)
    return _openai_texts(resp_json, job.api == "chat")


def parse_stream(job: Job, lines: list[str]) -> tuple[list[str], list[str], Optional[str]]:
    """(texts, finish reasons, in-band error) of an SSE answer; asserts it ended with [DONE]."""
    assert lines and lines[-1] == "data: [DONE]", f"stream of {job.rid} did not end with [DONE]: {lines[-3:]}"
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    error = None
    for line in lines[:-1]:
        event = json.loads(line[len("data: "):])
        if "error" in event:
            error = json.dumps(event["error"])
            continue
        if job.api == "native":
            i = event.get("index", 0)
            texts[i] = event["text"]  # cumulative
            fr = event["meta_info"]["finish_reason"]
            if fr is not None:
                finish[i] = fr["type"]
            continue
        for c in event.get("choices", []):
            i = c["index"]
            piece = (c.get("delta") or {}).get("content") if job.api == "chat" else c.get("text")
            texts[i] = texts.get(i, "") + (piece or "")
            if c.get("finish_reason"):
                finish[i] = c["finish_reason"]
    order = sorted(texts)
    return [texts[i] for i in order], [finish.get(i, "") for i in order], error


# ---- load ---------------------------------------------------------------------------------------------
async def _one(client: httpx.AsyncClient, job: Job) -> None:
    t0 = time.monotonic()
    if job.stream:
        async with client.stream("POST", job.path, json=job.body) as resp:
            job.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                job.error = resp.text
                return
            lines = [line async for line in resp.aiter_lines() if line]
        job.texts, job.finish, job.error = parse_stream(job, lines)
    else:
        resp = await client.post(job.path, json=job.body)
        job.status = resp.status_code
        if resp.status_code != 200:
            job.error = resp.text
            return
        job.texts, job.finish = parse_response(job, resp.json())
    job.latency_s = time.monotonic() - t0


async def _run_job(client: httpx.AsyncClient, job: Job, sem: asyncio.Semaphore) -> None:
    async with sem:
        task = asyncio.create_task(_one(client, job))
        aborter = None
        if job.abort_after_s is not None:
            async def abort_later() -> None:
                await asyncio.sleep(job.abort_after_s)  # type: ignore[arg-type]
                await client.post("/abort_request", json={"rid": job.rid})
            aborter = asyncio.create_task(abort_later())
        try:
            await asyncio.wait_for(task, job.disconnect_after_s)  # None: no limit
        except asyncio.TimeoutError:
            job.disconnected = True  # the task was cancelled: httpx closed the connection
        if aborter is not None:
            await aborter


async def _wait_idle(client: httpx.AsyncClient, timeout_s: float) -> None:
    """Until the scheduler runs and queues nothing (requests of gone clients are aborted by then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = (await client.get("/get_server_info")).json()["internal_state"]
        if state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0:
            return
        assert time.monotonic() < deadline, f"scheduler still busy {timeout_s} s after a wave: {state}"
        await asyncio.sleep(0.05)


async def _load(url: str, jobs: list[Job], concurrency: int, wave_size: int, timeout_s: float) -> None:
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        sem = asyncio.Semaphore(concurrency)
        for start in range(0, len(jobs), wave_size):
            await asyncio.gather(*(_run_job(client, job, sem) for job in jobs[start:start + wave_size]))
            await _wait_idle(client, timeout_s=60.0)


def run_load(url: str, jobs: list[Job], concurrency: int, wave_size: Optional[int] = None,
             timeout_s: float = 600.0) -> float:
    """Send every job, ``wave_size`` at a time (all at once if None), at most ``concurrency`` in
    flight, waiting for the scheduler to idle after each wave; returns the wall time in seconds.
    A client timeout raises (a hang)."""
    t0 = time.monotonic()
    asyncio.run(_load(url, jobs, concurrency, wave_size or len(jobs) or 1, timeout_s))
    return time.monotonic() - t0


def replay_alone(client: httpx.Client, job: Job) -> list[str]:
    """The job's texts when it is the only request of a server with an empty cache."""
    assert client.post("/flush_cache").status_code == 200
    body = {**job.body, "stream": False, "rid": f"{job.rid}-alone"}
    resp = client.post(job.path, json=body)
    assert resp.status_code == 200, resp.text
    return parse_response(job, resp.json())[0]
