"""Online serving benchmark: an asyncio load generator against one or more running servers.

Backends: ``radixlm`` / ``sglang`` (native ``POST /generate``, SSE stream of cumulative events with
``meta_info.cached_tokens``), ``openai`` (``/v1/completions``) and ``openai-chat``
(``/v1/chat/completions``) for vLLM, llama.cpp's ``llama-server`` or radixlm's own ``/v1``;
``hf-serve`` (``transformers serve``'s ``/v1/completions``, EOS disabled through its
``generation_config`` field since it rejects ``ignore_eos``). Every request streams, so TTFT and
inter-token latencies are real. ``hf-static`` is no server: transformers static-batch ``generate`` in
this process (``--base-url hf-static=<model folder>``, see ``run_hf_static``).

    python benchmarks/bench_serving.py --backend radixlm --base-url http://127.0.0.1:30000 \\
        --tokenizer stories260k --dataset-name generated-shared-prefix --max-concurrency 8
    # side by side (same prompts, in turn; ratios vs the first target):
    python benchmarks/bench_serving.py --tokenizer smollm2 \\
        --base-url radixlm=http://127.0.0.1:30000 --backend radixlm \\
        --base-url vllm=http://127.0.0.1:8000 --backend openai

``--backend`` / ``--model`` / ``--json-schema-field`` / ``--tool-choice`` are given once (all targets)
or once per ``--base-url``; several ``--tool-choice`` values with one ``--base-url`` run that server
once per value (``tool-calls``: the constrained calls and the same requests unconstrained, side by
side in one run:

    python benchmarks/bench_serving.py --backend openai-chat --base-url radixlm=http://127.0.0.1:30000 \
        --dataset-name tool-calls --tool-choice required --tool-choice none --max-concurrency 4
 Arrivals: ``--request-rate R`` (Poisson, requests/s; ``inf`` = all at once),
optionally capped by ``--max-concurrency``. Metrics (see ``compute_metrics``): request / input /
output token throughput, TTFT, TPOT (per request: (latency - TTFT) / (output tokens - 1)), ITL (gaps
between streamed chunks), end-to-end latency (mean, p50, p99, ms), cache hit rate = cached prompt
tokens / prompt tokens (from ``meta_info.cached_tokens``, ``usage.prompt_tokens_details.cached_tokens``
or llama-server's ``timings.cache_n``; null if the server reports none), successes and failures;
``tool-calls``: ``tool_call_rate``, the share of requests whose output had calls, all with arguments
that parse as a JSON object (streamed call deltas count as output for TTFT / ITL). One JSON per run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import aiohttp
import httpx
import numpy as np


def _load_sibling(name: str) -> Any:
    """Import ``benchmarks/<name>.py`` by path under a private name (``datasets`` / ``common`` would
    clash with other top-level modules)."""
    mod_name = f"_radixlm_bench_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


ds = _load_sibling("datasets")
common = _load_sibling("common")
busy_processes = _load_sibling("contention").busy_processes
BenchRequest = ds.BenchRequest
NATIVE = ("radixlm", "sglang")
BACKENDS = (*NATIVE, "openai", "openai-chat", "hf-serve", "hf-static")
SCHEMA_FIELDS = ("auto", "json_schema", "response_format", "none")
TOOL_CHOICES = ("required", "auto", "none", "omit")  # omit: the request without its tools
WARMUP_PROMPT = "The quick brown fox jumps over the lazy dog."


@dataclass
class Target:
    label: str
    url: str
    backend: str
    model: Optional[str] = None
    json_schema_field: str = "auto"  # how json-schema requests carry the schema; "none": unconstrained
    tool_choice: str = "required"  # tool-calls requests: their tool_choice, or "omit" (no tools sent)


@dataclass
class RequestOutput:
    """What one streamed request measured (times in seconds)."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_len: int = 0
    cached_tokens: Optional[int] = None
    # radixlm with --enable-hierarchical-cache: cached tokens per tier ({"device", "host"[, "storage"]})
    cached_tokens_details: Optional[dict[str, int]] = None
    turn: Optional[int] = None  # multi-turn: the turn's index in its conversation
    ttft: Optional[float] = 0.0  # None: not measurable (hf-static has no stream)
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""
    # radixlm / SGLang with --speculative-algorithm: meta_info's verify steps and tokens per step.
    spec_verify_ct: Optional[int] = None
    spec_accept_length: Optional[float] = None
    output_ids: Optional[list[int]] = None  # hf-static only
    tool_calls: dict[int, dict] = field(default_factory=dict)  # streamed calls: index -> name, arguments


# ---------------------------------------------------------------- request functions

def _native_payload(target: Target, req: BenchRequest, prompt: str, args: argparse.Namespace) -> dict:
    sp = {"temperature": args.temperature, "max_new_tokens": req.output_len, "ignore_eos": req.ignore_eos}
    if req.json_schema is not None and target.json_schema_field != "none":
        sp["json_schema"] = json.dumps(req.json_schema)
    return {"text": prompt, "sampling_params": sp, "stream": True}


def _openai_payload(target: Target, req: BenchRequest, prompt: Any, args: argparse.Namespace) -> dict:
    body = {"model": target.model, "max_tokens": req.output_len, "temperature": args.temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if target.backend == "hf-serve":  # transformers serve answers 422 to fields it does not know
        del body["stream_options"]  # (it always sends usage in the last chunk)
        if req.ignore_eos:  # replaces the model's generation config; max_tokens / temperature still apply
            body["generation_config"] = json.dumps({"eos_token_id": -1})
    elif req.ignore_eos:
        body["ignore_eos"] = True  # vLLM, llama-server and SGLang accept it as an extra field
    field = target.json_schema_field
    if field == "auto":  # SGLang / radixlm / llama-server: completions take json_schema, chat response_format
        field = "response_format" if target.backend == "openai-chat" else "json_schema"
    if req.json_schema is None or field == "none":
        pass
    elif field == "json_schema":
        body["json_schema"] = req.json_schema
    else:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": req.json_schema}}
    if req.tools is not None and target.tool_choice != "omit":
        body["tools"], body["tool_choice"] = req.tools, target.tool_choice
    body["messages" if target.backend == "openai-chat" else "prompt"] = prompt
    return body


async def _sse(resp: aiohttp.ClientResponse):
    """Decoded ``data:`` payloads of an SSE response (``[DONE]`` ends it)."""
    async for raw in resp.content:  # one line per iteration
        if not raw.startswith(b"data:"):
            continue
        data = raw[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


async def send_request(client: aiohttp.ClientSession, target: Target, req: BenchRequest, prompt: Any,
                       args: argparse.Namespace, tokenizer: Any) -> RequestOutput:
    """Send one streaming request; ``prompt`` is text (native / completions) or chat messages."""
    out = RequestOutput(prompt_len=req.prompt_len)
    native = target.backend in NATIVE
    if native:
        path, body = "/generate", _native_payload(target, req, prompt, args)
    else:
        path = "/v1/chat/completions" if target.backend == "openai-chat" else "/v1/completions"
        body = _openai_payload(target, req, prompt, args)
    start = last = time.perf_counter()
    n_out, usage, timings = 0, None, None
    try:
        async with client.post(target.url + path, json=body) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.read())[:300]!r}"
                return out
            async for ev in _sse(resp):
                if "error" in ev and ev["error"]:
                    out.error = str(ev["error"])[:300]
                    return out
                now = time.perf_counter()
                if native:
                    meta = ev.get("meta_info", {})
                    new_n = meta.get("completion_tokens", n_out)
                    grew = new_n > n_out or len(ev.get("text", "")) > len(out.text)
                    n_out, out.text = new_n, ev.get("text", out.text)
                    out.prompt_len = meta.get("prompt_tokens", out.prompt_len)
                    out.cached_tokens = meta.get("cached_tokens", out.cached_tokens)
                    out.cached_tokens_details = meta.get("cached_tokens_details", out.cached_tokens_details)
                    out.spec_verify_ct = meta.get("spec_verify_ct", out.spec_verify_ct)
                    out.spec_accept_length = meta.get("spec_accept_length", out.spec_accept_length)
                else:
                    usage = ev.get("usage") or usage
                    timings = ev.get("timings") or timings
                    c = (ev.get("choices") or [{}])[0]  # the usage-only last chunk has no choices
                    d = c.get("delta") or {}
                    delta = (d.get("content") if "delta" in c else c.get("text")) or ""
                    calls = _add_call_deltas(out.tool_calls, d.get("tool_calls") or [])
                    grew = bool(delta or d.get("reasoning_content") or calls)
                    out.text += delta
                if grew:
                    if out.ttft == 0.0:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
        out.latency = time.perf_counter() - start
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:  # JSONDecodeError is a ValueError
        out.error = f"{type(e).__name__}: {e}"[:300]
        return out
    if not native:
        if usage:
            n_out = usage.get("completion_tokens") or 0
            out.prompt_len = usage.get("prompt_tokens") or out.prompt_len
            details = usage.get("prompt_tokens_details") or {}
            out.cached_tokens = details.get("cached_tokens")
            out.cached_tokens_details = details.get("cached_tokens_details")
        else:
            n_out = len(tokenizer.encode(out.text, add_special_tokens=False))
        if out.cached_tokens is None and timings and "cache_n" in timings:
            out.cached_tokens = timings["cache_n"]  # llama-server
    out.output_len = n_out
    out.success = n_out > 0 and out.ttft > 0
    if not out.success:
        out.error = "no output tokens"
    return out


def _add_call_deltas(calls: dict[int, dict], deltas: list[dict]) -> int:
    """Merge OpenAI ``delta.tool_calls`` pieces into ``calls``; the characters they carried."""
    n = 0
    for d in deltas:
        fn = d.get("function") or {}
        call = calls.setdefault(d.get("index", 0), {"name": "", "arguments": ""})
        call["name"] += fn.get("name") or ""
        call["arguments"] += fn.get("arguments") or ""
        n += len(fn.get("name") or "") + len(fn.get("arguments") or "")
    return n


def _valid_calls(o: RequestOutput) -> bool:
    """At least one call, each named and with arguments that parse as a JSON object."""
    return bool(o.tool_calls) and all(c["name"] and _valid_json(c["arguments"]) for c in o.tool_calls.values())


# ---------------------------------------------------------------- metrics

def _stats(values: list[float], scale: float = 1000.0) -> dict[str, Optional[float]]:
    """mean / median / p99 (numpy's linear interpolation) of ``values`` × ``scale``; None if empty."""
    if not values:
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(values, dtype=float) * scale
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def compute_metrics(outputs: list[RequestOutput], duration_s: float) -> dict[str, Any]:
    """Aggregate metrics of one run. Latencies in ms; throughputs per second of ``duration_s``.
    TPOT only counts requests with > 1 output token; the cache hit rate only requests that reported
    ``cached_tokens`` (None when none did); TTFT / TPOT / ITL are None when no request streamed."""
    ok = [o for o in outputs if o.success]
    n_in, n_out = sum(o.prompt_len for o in ok), sum(o.output_len for o in ok)
    streamed = [o for o in ok if o.ttft is not None]
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in streamed if o.output_len > 1]
    reported = [o for o in ok if o.cached_tokens is not None]
    hit = (sum(o.cached_tokens for o in reported) / max(1, sum(o.prompt_len for o in reported))) if reported else None
    m: dict[str, Any] = {
        "completed": len(ok), "failed": len(outputs) - len(ok), "duration_s": duration_s,
        "total_input_tokens": n_in, "total_output_tokens": n_out,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else 0.0,
        "input_throughput": n_in / duration_s if duration_s > 0 else 0.0,
        "output_throughput": n_out / duration_s if duration_s > 0 else 0.0,
        "cache_hit_rate": hit,
        **tier_hit_rates(ok),
        "concurrency": sum(o.latency for o in ok) / duration_s if duration_s > 0 else 0.0,
    }
    spec = [o for o in ok if o.spec_verify_ct]
    if spec:  # output tokens per verify step over all requests (SGLang's spec_accept_length)
        m["spec_accept_length"] = (sum(o.spec_accept_length * o.spec_verify_ct for o in spec)  # type: ignore[operator]
                                   / sum(o.spec_verify_ct for o in spec))  # type: ignore[misc]
    for name, vals in (("ttft_ms", [o.ttft for o in streamed]), ("tpot_ms", tpots),
                       ("itl_ms", [x for o in ok for x in o.itl]), ("e2e_latency_ms", [o.latency for o in ok])):
        for k, v in _stats(vals).items():
            m[f"{k}_{name}"] = v
    return m


def tier_hit_rates(outputs: list[RequestOutput]) -> dict[str, float]:
    """``cache_hit_rate_<tier>``: tokens served from each KV tier / prompt tokens, over the requests
    that reported ``cached_tokens_details`` (radixlm's hierarchical cache); empty when none did."""
    with_details = [o for o in outputs if o.cached_tokens_details is not None]
    prompt = max(1, sum(o.prompt_len for o in with_details))
    tiers: dict[str, int] = {}
    for o in with_details:
        for tier, n in o.cached_tokens_details.items():  # type: ignore[union-attr]
            tiers[tier] = tiers.get(tier, 0) + n
    return {f"cache_hit_rate_{tier}": n / prompt for tier, n in tiers.items()}


# ---------------------------------------------------------------- load generation

async def _arrivals(n: int, rate: float, rng: random.Random):
    """Yield ``0..n-1`` with exponential gaps of mean ``1/rate`` (Poisson); no wait if rate is inf."""
    for i in range(n):
        yield i
        if i < n - 1 and math.isfinite(rate):
            await asyncio.sleep(rng.expovariate(rate))


async def run_conversation(client, target: Target, turns: list[BenchRequest], args, tokenizer, limit,
                           on_done) -> list[RequestOutput]:
    """The turns of one multi-turn conversation in order; each resends the full history with the
    replies actually generated (text for native / completions, messages for chat)."""
    history, messages, outs = "", [], []
    for req in turns:
        prompt_text = req.user if not history else history + " " + req.user
        messages.append({"role": "user", "content": req.user})
        prompt = list(messages) if target.backend == "openai-chat" else prompt_text
        req_now = BenchRequest(**{**asdict(req), "prompt": prompt_text,
                                  "prompt_len": len(tokenizer.encode(prompt_text, add_special_tokens=False))})
        async with limit:
            o = await send_request(client, target, req_now, prompt, args, tokenizer)
        o.turn = req.turn
        outs.append(o)
        on_done()
        if not o.success:  # the history is broken; the rest of this conversation fails too
            for _ in turns[len(outs):]:
                outs.append(RequestOutput(error="earlier turn failed"))
                on_done()
            break
        history = prompt_text + o.text
        messages.append({"role": "assistant", "content": o.text})
    return outs


def _prompt_for(target: Target, req: BenchRequest) -> Any:
    if target.backend != "openai-chat":
        return req.prompt
    msgs = [{"role": "system", "content": req.system}] if req.system else []
    return msgs + [{"role": "user", "content": req.user or req.prompt}]


FLUSH_ROUTES = ("/flush_cache", "/reset_prefix_cache")  # radixlm / SGLang; vLLM (VLLM_SERVER_DEV_MODE=1)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


async def flush_prefix_cache(client: aiohttp.ClientSession, url: str, attempts: int = 20) -> Optional[str]:
    """Empty the server's prefix cache: ``POST /flush_cache`` (radixlm, SGLang), else ``POST
    /reset_prefix_cache`` (vLLM, served with ``VLLM_SERVER_DEV_MODE=1``; it answers ``{"success": false}``
    while blocks are still held, so it is retried for up to ``attempts`` x 0.25 s). Returns the route
    that emptied it, or None where neither exists or the reset kept failing (the run is then marked
    ``cache_flush: null``: a repeated workload may find its prefixes already cached)."""
    for route in FLUSH_ROUTES:
        for _ in range(attempts):
            async with client.post(url + route) as r:
                if r.status in (404, 405):
                    break
                body = _json_or_none(await r.text()) if r.status == 200 else None
            refused = isinstance(body, dict) and body.get("success") is False  # vLLM: blocks still held
            if r.status == 200 and not refused:
                return route
            await asyncio.sleep(0.25)
    return None


async def _prepare(client: aiohttp.ClientSession, target: Target, requests: list[BenchRequest], args, tokenizer) -> Optional[str]:
    """Fill in the served model name (OpenAI), warm up with one short request, empty the prefix cache
    (flush_prefix_cache) so hits come from the workload itself; returns the flush route used (None:
    not flushed)."""
    if target.backend not in NATIVE and not target.model:
        async with client.get(target.url + "/v1/models") as r:
            target.model = (await r.json())["data"][0]["id"]
    if not args.no_warmup:
        # Not a workload prompt: a server that cannot be flushed (llama-server) would otherwise keep it
        # cached and give the workload's first request a free hit.
        warm = BenchRequest(prompt=WARMUP_PROMPT, prompt_len=0, output_len=4, user=WARMUP_PROMPT)
        o = await send_request(client, target, warm, _prompt_for(target, warm), args, tokenizer)
        if not o.success:
            raise RuntimeError(f"{target.label}: warm-up request failed: {o.error}")
    return None if args.no_flush_cache else await flush_prefix_cache(client, target.url)


def client_session(timeout_s: float, headers: dict[str, str]) -> aiohttp.ClientSession:
    """The HTTP client of a run: aiohttp, as SGLang's bench_serving (per streamed chunk it costs the client
    a fraction of httpx's CPU time, which on a small box is taken from the server being measured); no
    connection limit; SSE lines of up to 64 MiB (a native /generate event carries the whole text so
    far); ``timeout_s`` to connect and between two reads. Call inside a running event loop."""
    timeout = aiohttp.ClientTimeout(sock_connect=timeout_s, sock_read=timeout_s)
    return aiohttp.ClientSession(timeout=timeout, headers=headers, connector=aiohttp.TCPConnector(limit=0),
                                 read_bufsize=1 << 26)


async def benchmark(target: Target, requests: list[BenchRequest], args, tokenizer) -> dict[str, Any]:
    """Run the whole workload against one target; returns its metrics and per-request records."""
    from tqdm.asyncio import tqdm

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if any(r.tools is not None for r in requests) and target.backend != "openai-chat":
        raise RuntimeError("the tool-calls workload needs --backend openai-chat")
    async with client_session(args.timeout, headers) as client:
        flushed = await _prepare(client, target, requests, args, tokenizer)
        limit = asyncio.Semaphore(args.max_concurrency or 10 ** 9)
        bar = tqdm(total=len(requests), desc=target.label, disable=args.disable_tqdm, leave=False)
        convs: dict[int, list[BenchRequest]] = {}
        for r in requests:
            convs.setdefault(r.conversation if r.conversation is not None else -id(r), []).append(r)
        units = list(convs.values())  # a conversation, or one single request

        async def one(unit: list[BenchRequest]) -> list[RequestOutput]:
            if unit[0].conversation is not None:
                return await run_conversation(client, target, unit, args, tokenizer, limit, lambda: bar.update(1))
            async with limit:
                o = await send_request(client, target, unit[0], _prompt_for(target, unit[0]), args, tokenizer)
            bar.update(1)
            return [o]

        tasks = []
        t0 = time.perf_counter()
        async for i in _arrivals(len(units), args.request_rate, random.Random(args.seed)):
            tasks.append(asyncio.create_task(one(units[i])))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        bar.close()
    outputs = [o for group in results for o in group]
    metrics = compute_metrics(outputs, duration)
    if args.dataset_name == "json-schema":  # share of outputs that parse as a JSON object
        metrics["json_valid_rate"] = sum(_valid_json(o.text) for o in outputs if o.success) / max(1, len(outputs))
    if args.dataset_name == "tool-calls":
        metrics["tool_call_rate"] = sum(_valid_calls(o) for o in outputs if o.success) / max(1, len(outputs))
    errors = sorted({o.error for o in outputs if not o.success})
    return {"label": target.label, "backend": target.backend, "base_url": target.url, "model": target.model,
            "cache_flush": flushed,
            **({"tool_choice": target.tool_choice} if args.dataset_name == "tool-calls" else {}),
            "metrics": metrics, "errors": errors[:10],
            "requests": [{"success": o.success, "prompt_len": o.prompt_len, "output_len": o.output_len,
                          "cached_tokens": o.cached_tokens, "cached_tokens_details": o.cached_tokens_details,
                          "turn": o.turn, "ttft": o.ttft, "latency": o.latency,
                          "text": o.text, "spec_verify_ct": o.spec_verify_ct, "spec_accept_length": o.spec_accept_length}
                         for o in outputs]}


def hf_static_generate(model_path: str, requests: list[BenchRequest], tokenizer: Any, batch_size: int,
                       threads: Optional[int] = None) -> tuple[list[RequestOutput], float]:
    """transformers static batching in this process: the requests in order, ``batch_size`` at a time,
    each batch one ``generate`` call (fp32, greedy, left padding, ``min_new_tokens = max_new_tokens`` =
    the batch's longest output length; a request keeps its own ``output_len`` tokens, the rest of its
    row is the waste static batching pays). Prompts are tokenized with special tokens (BOS), as a
    server does. Every request is taken as arrived at the start, so its latency (s) is the end of its
    batch minus the start of the first; TTFT and ITL are not measurable (None / empty). ``threads``
    sets ``torch.set_num_threads``. One 4-token warm-up batch runs first, untimed. Returns the outputs
    and the duration (s)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    model = common.load_hf_model(model_path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = [tokenizer.encode(r.prompt) for r in requests]
    common.hf_generate(model, prompts[:1], 4, pad)
    outs: list[RequestOutput] = []
    t0 = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        new = common.hf_generate(model, prompts[i:i + batch_size], max(r.output_len for r in batch), pad)
        end = time.perf_counter() - t0
        for r, p, ids in zip(batch, prompts[i:i + batch_size], new):
            ids = ids[:r.output_len]
            outs.append(RequestOutput(success=True, prompt_len=len(p), output_len=len(ids), ttft=None, latency=end,
                                      text=tokenizer.decode(ids), output_ids=ids))
    return outs, time.perf_counter() - t0


def run_hf_static(target: Target, requests: list[BenchRequest], args, tokenizer) -> dict:
    """``hf_static_generate`` on ``target.url`` (a model folder) as a target result like ``benchmark``'s.
    Single-turn workloads without a JSON schema only (``RuntimeError`` otherwise: reported skipped)."""
    if any(r.conversation is not None or r.json_schema is not None for r in requests):
        raise RuntimeError("hf-static runs single-turn unconstrained workloads only")
    outputs, duration = hf_static_generate(target.url, requests, tokenizer, args.hf_batch_size, args.hf_threads)
    return {"label": target.label, "backend": target.backend, "base_url": target.url, "model": target.url,
            "metrics": {**compute_metrics(outputs, duration), "batch_size": args.hf_batch_size},
            "errors": [], "requests": [{"success": o.success, "prompt_len": o.prompt_len, "output_len": o.output_len,
                                        "cached_tokens": None, "ttft": None, "latency": o.latency, "text": o.text}
                                       for o in outputs]}


def _valid_json(text: str) -> bool:
    return isinstance(_json_or_none(text), dict)


# ---------------------------------------------------------------- CLI, report

ROWS = ["completed", "failed", "duration_s", "request_throughput", "input_throughput", "output_throughput",
        "cache_hit_rate", "cache_hit_rate_device", "cache_hit_rate_host", "cache_hit_rate_storage",
        *[f"{s}_{n}_ms" for n in ("ttft", "tpot", "itl", "e2e_latency") for s in ("mean", "median", "p99")],
        "concurrency", "json_valid_rate", "tool_call_rate", "spec_accept_length"]



def identical_outputs(results: list[dict]) -> dict[str, bool]:
    """For each target after the first that ran the same requests: is every output text equal to the
    first target's (meaningful for greedy runs, e.g. speculative decoding on vs off)?"""
    ran = [r for r in results if not r.get("skipped") and r["requests"]]
    if len(ran) < 2:
        return {}
    base = [q["text"] for q in ran[0]["requests"]]
    return {r["label"]: [q["text"] for q in r["requests"]] == base for r in ran[1:]}


def report(results: list[dict]) -> list[dict]:
    """Print one table: a row per metric, a column per target, then ``<label>/<first>`` ratios."""
    base = results[0]
    rows = []
    for key in ROWS:
        if all(key not in r["metrics"] for r in results):
            continue
        row = {"metric": key}
        for r in results:
            row[r["label"]] = r["metrics"].get(key)
        for r in results[1:]:
            a, b = r["metrics"].get(key), base["metrics"].get(key)
            row[f"{r['label']}/{base['label']}"] = a / b if isinstance(a, (int, float)) and b else None
        rows.append(row)
    cols = ["metric", *[r["label"] for r in results], *[f"{r['label']}/{base['label']}" for r in results[1:]]]
    common.print_table(rows, cols)
    return rows


def parse_targets(args: argparse.Namespace) -> list[Target]:
    urls = args.base_url or ["http://127.0.0.1:30000"]
    choices = args.tool_choice or ["required"]
    if len(urls) == 1 and len(choices) > 1:  # one server, once per tool_choice
        label, _, url = urls[0].rpartition("=") if "=" in urls[0].split("://")[0] else ("", "", urls[0])
        urls = [f"{label or (args.backend or ['radixlm'])[0]}-{c}={url}" for c in choices]
    n = len(urls)
    for name in ("backend", "model", "json_schema_field", "tool_choice"):
        vals = getattr(args, name) or []
        if len(vals) not in (0, 1, n):
            raise SystemExit(f"--{name.replace('_', '-')} given {len(vals)} times; give it once or once per "
                             f"--base-url ({n})")
    backends = args.backend or ["radixlm"]
    models = args.model or [None]
    fields = args.json_schema_field or ["auto"]
    targets = []
    for i, spec in enumerate(urls):
        label, _, url = spec.rpartition("=") if "=" in spec.split("://")[0] else ("", "", spec)
        backend = backends[i if len(backends) == n else 0]
        if backend not in BACKENDS:
            raise SystemExit(f"unknown backend {backend!r}; one of {BACKENDS}")
        schema_field = fields[i if len(fields) == n else 0]
        if schema_field not in SCHEMA_FIELDS:
            raise SystemExit(f"unknown --json-schema-field {schema_field!r}; one of {SCHEMA_FIELDS}")
        choice = choices[i if len(choices) == n else 0]
        if choice not in TOOL_CHOICES:
            raise SystemExit(f"unknown --tool-choice {choice!r}; one of {TOOL_CHOICES}")
        targets.append(Target(label or f"{backend}{i if n > 1 else ''}", url.rstrip("/"), backend,
                              models[i if len(models) == n else 0], schema_field, choice))
    return targets


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench_serving", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", action="append", help="[LABEL=]URL; repeat to compare servers "
                                                        "(hf-static: [LABEL=]MODEL_FOLDER)")
    ap.add_argument("--backend", action="append", help=f"one of {BACKENDS}; once, or once per --base-url")
    ap.add_argument("--model", action="append", help="served model name for OpenAI backends (default: /v1/models)")
    ap.add_argument("--tokenizer", help="tokenizer folder or stories260k / smollm2 (default: the model "
                                        "folder a target reports)")
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per s (inf: all at once)")
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=3600.0,
                    help="seconds a request may take to connect, or wait for its next bytes")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--no-flush-cache", action="store_true", help="do not empty the prefix cache after the warm-up (POST /flush_cache, or vLLM's /reset_prefix_cache)")
    ap.add_argument("--disable-tqdm", action="store_true")
    ap.add_argument("--json-schema-field", action="append",
                    help=f"one of {SCHEMA_FIELDS}; once, or once per --base-url. How json-schema requests carry "
                         "the schema on OpenAI backends (auto: json_schema for /v1/completions, response_format "
                         "for chat; vLLM's completions want response_format); none: send no schema (the "
                         "unconstrained baseline on the same prompts, any backend)")
    ap.add_argument("--tool-choice", action="append",
                    help=f"one of {TOOL_CHOICES}; once, once per --base-url, or several with one --base-url (that "
                         "server once per value). tool-calls requests send their tools with this tool_choice "
                         "(default required); omit sends them without tools")
    ap.add_argument("--hf-batch-size", type=int, default=32, help="hf-static: requests per generate call")
    ap.add_argument("--hf-threads", type=int, default=None,
                    help="hf-static: torch.set_num_threads (default: torch's, i.e. OMP_NUM_THREADS)")
    ap.add_argument("--busy-procs", type=int, default=0,
                    help="keep N CPU-bound processes running beside the servers while each target is measured "
                         "(contention; the warm-up too)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every target this many times, the order reversed each round (A B, B A, A B ...), "
                         "and report each target's round with the highest output throughput (its other rounds' "
                         "figures are kept in the JSON): on a host whose speed drifts for minutes at a time, one "
                         "turn in a slow phase should not decide the comparison")
    ap.add_argument("--output", default="bench_results/bench_serving.json")
    ds.add_dataset_args(ap)
    return ap


def _tokenizer_source(args: argparse.Namespace, targets: list[Target]) -> str:
    """``--tokenizer``, else the first local model folder a target reports (``/get_model_info``
    ``model_path`` on radixlm / SGLang, ``/v1/models`` ``root`` on radixlm / vLLM)."""
    if args.tokenizer:
        return args.tokenizer
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    for t in targets:
        if t.backend == "hf-static":
            return t.url
        for route, pick in (("/get_model_info", lambda d: d.get("model_path")),
                            ("/v1/models", lambda d: d["data"][0].get("root"))):
            try:
                path = pick(httpx.get(t.url + route, timeout=10, headers=headers).json())
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
                continue
            if path and Path(path).is_dir():
                return path
    raise SystemExit("--tokenizer is required (no target reports a local model folder)")


def _run_target(target: Target, requests: list[BenchRequest], args, tokenizer) -> dict:
    """``benchmark`` one target (``run_hf_static`` for hf-static); an unreachable server, a failed
    warm-up or an unsupported workload marks it skipped."""
    try:
        if target.backend == "hf-static":
            return run_hf_static(target, requests, args, tokenizer)
        return asyncio.run(benchmark(target, requests, args, tokenizer))
    except (httpx.HTTPError, aiohttp.ClientError, RuntimeError, KeyError, ValueError, OSError) as e:
        return {"label": target.label, "backend": target.backend, "base_url": target.url, "model": target.model,
                "skipped": f"{type(e).__name__}: {e}"[:500], "metrics": {}, "errors": [], "requests": []}


def round_orders(n_targets: int, rounds: int) -> list[list[int]]:
    """The target indices each round runs, in order: forwards, then backwards, alternating
    (ABBA for two targets and two rounds)."""
    forward = list(range(n_targets))
    return [forward if r % 2 == 0 else forward[::-1] for r in range(rounds)]


def best_rounds(per_round: list[list[dict]]) -> list[dict]:
    """Per target (results[t] of each round, in target order), the round whose output throughput is
    highest (a skipped or failed round counts as 0), with ``rounds``: every round's output tok/s."""
    chosen = []
    for t in range(len(per_round[0])):
        runs = [r[t] for r in per_round]
        rates = [run.get("metrics", {}).get("output_throughput") or 0.0 for run in runs]
        best = max(range(len(runs)), key=lambda i: rates[i])
        chosen.append({**runs[best], "rounds": {"output_throughput": rates, "chosen": best}})
    return chosen


def main(argv: Optional[list[str]] = None) -> dict:
    """Run the benchmark; returns the JSON payload it wrote."""
    args = build_parser().parse_args(argv)
    targets = parse_targets(args)
    tokenizer = ds.load_tokenizer(_tokenizer_source(args, targets))
    requests = ds.build_dataset(args, tokenizer)
    dataset = ds.describe(args)
    print(f"dataset {dataset}: {len(requests)} requests, request rate {args.request_rate}, "
          f"max concurrency {args.max_concurrency}")
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    per_round = []
    for order in round_orders(len(targets), args.rounds):
        results = [None] * len(targets)
        for i in order:
            with busy_processes(args.busy_procs):
                results[i] = {**_run_target(targets[i], requests, args, tokenizer), "busy_procs": args.busy_procs}
        per_round.append(results)
    results = per_round[0] if args.rounds == 1 else best_rounds(per_round)
    for r in results:
        if r.get("skipped"):
            print(f"{r['label']}: skipped: {r['skipped']}")
        elif r["errors"]:
            print(f"{r['label']}: {r['metrics']['failed']} failed, e.g. {r['errors'][0]}")
    rows = report(results)
    same = identical_outputs(results)
    if same:
        print("outputs identical to " + results[0]["label"] + ": "
              + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in same.items()))
    rate = args.request_rate if math.isfinite(args.request_rate) else "inf"  # strict JSON has no Infinity
    payload = {"benchmark": "bench_serving", "dataset": dataset, "tokenizer": tokenizer.name_or_path,
               "busy_procs": args.busy_procs, "rounds": args.rounds,
               "request_rate": rate, "max_concurrency": args.max_concurrency,
               "targets": results, "table": rows, "identical_outputs": same, "args": {**vars(args), "request_rate": rate}}
    common.write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
