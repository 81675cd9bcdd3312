"""Synthetic serving workloads for ``bench_serving.py``, deterministic from a seed.

Prompts are built from the served model's own tokenizer so their token lengths are exact: words are
drawn from the tokenizer's "clean" word tokens (a space marker ``▁``/``Ġ`` followed by ASCII letters),
and for such sequences ``encode(decode(ids)) == ids`` (checked by the tests for stories260K and
SmolLM2). Lengths exclude special tokens (a server adds BOS / a chat template on top).

Workloads (SGLang's ``bench_serving`` names):

- ``random``: ``n`` prompts, input length uniform in ``[input_min, input_max]``, output length uniform
  in ``[output_min, output_max]`` (EOS ignored, so that many tokens are generated).
- ``generated-shared-prefix``: ``G`` groups × ``P`` prompts; each group shares a system prompt of
  ``S`` tokens, each prompt adds its own question of ``Q`` tokens; ``O`` output tokens. Prompt =
  ``decode(system_ids + question_ids)``, so the prefix re-tokenizes to exactly ``S`` tokens (SGLang
  joins with ``"\\n\\n"``; a word boundary keeps the split exact for every tokenizer). Grouped order.
- ``multi-turn``: ``C`` conversations × ``T`` turns; every turn is a user message of ``[turn_min,
  turn_max]`` tokens. The runner sends the turns of a conversation in order and each turn resends the
  whole history including the reply actually generated (see ``bench_serving.run_conversation``).
- ``json-schema``: prompts asking for a JSON object, each with its own small schema (object with 2–4
  typed, bounded properties) passed as ``sampling_params.json_schema`` (native) or
  ``response_format`` (OpenAI); EOS is honoured (the grammar ends the output).
- ``tool-calls``: agent-style chat requests: a system prompt, a user request for one of four
  realistic tools (weather, flights, calendar, stock price; slot values drawn from the seed), and
  all four tool definitions (``TOOLS``, OpenAI chat shape) with every request, as agents send them.
  The runner sends them with the target's ``tool_choice`` (``required`` / ``auto`` / ``none``, or
  ``omit``: no tools at all), so one run compares the constrained calls with the same requests
  unconstrained. EOS is honoured (the grammar ends a call); ``output_len`` is the cap.
- ``copy-edit``: copy-heavy prompts, where most of the answer repeats the prompt (the workload of
  n-gram speculative decoding), cycling through three kinds built from text shipped in this
  repository: JSON rewriting (records drawn from the seed, "the same JSON with one field changed"),
  code editing (a window of a radixlm source file, "the same code with one name renamed") and quoting
  RAG (a paragraph of docs/architecture.md, "quote the passage"). Prompts end where the copy starts;
  ``output_len`` is the copied text's token length capped at ``--copy-output-len`` (EOS ignored).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

DATASETS = ("random", "generated-shared-prefix", "multi-turn", "json-schema", "tool-calls", "copy-edit")
REPO = Path(__file__).resolve().parents[1]


@dataclass
class BenchRequest:
    """One request of a workload. ``prompt`` is the full text for native / completions backends;
    ``system`` + ``user`` is the same prompt split for chat backends (``system`` may be None).
    Multi-turn requests carry ``conversation`` / ``turn`` and only the new user message: the runner
    builds the prompt from the history at run time."""

    prompt: str
    prompt_len: int
    output_len: int
    user: str = ""
    system: Optional[str] = None
    json_schema: Optional[dict] = None
    ignore_eos: bool = True
    conversation: Optional[int] = None
    turn: Optional[int] = None
    group: Optional[int] = None
    tools: Optional[list[dict]] = None
    extra: dict[str, Any] = field(default_factory=dict)


def load_tokenizer(name_or_path: str) -> Any:
    """A transformers tokenizer from a local folder; ``stories260k`` / ``smollm2`` are aliases
    (SmolLM2 = radixlm's demo model folder, via ``resolve_model_path``)."""
    from transformers import AutoTokenizer

    from radixlm.srt.model_loader import resolve_model_path

    stories = Path(__file__).resolve().parents[1] / "tests" / "assets" / "models" / "stories260k-hf"
    aliases = {"stories260k": str(stories), "smollm2": None}
    path = resolve_model_path(aliases[name_or_path] if name_or_path in aliases else name_or_path)
    return AutoTokenizer.from_pretrained(path)


class TextMaker:
    """Draws random "words" (clean word tokens) and turns id lists into text with exact lengths."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        words = []
        for i in range(tokenizer.vocab_size):
            piece = tokenizer.convert_ids_to_tokens(i)
            if isinstance(piece, str) and piece[:1] in ("▁", "Ġ") and len(piece) > 2 and piece[1:].isascii() \
                    and piece[1:].isalpha():
                words.append(i)
        special = set(tokenizer.all_special_ids)
        # Fallback for exotic tokenizers: any non-special id (lengths then only approximate).
        self.words = words if len(words) >= 16 else [i for i in range(tokenizer.vocab_size) if i not in special]

    def ids(self, rng: random.Random, n: int) -> list[int]:
        return [rng.choice(self.words) for _ in range(n)]

    def text(self, ids: list[int]) -> str:
        return self.tok.decode(ids)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False))


def sample_random(tok: Any, num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                  seed: int = 0) -> list[BenchRequest]:
    """``num_prompts`` prompts of uniform random input/output lengths (inclusive ranges)."""
    rng, tm = random.Random(seed), TextMaker(tok)
    out = []
    for _ in range(num_prompts):
        ids = tm.ids(rng, rng.randint(*input_len))
        text = tm.text(ids)
        out.append(BenchRequest(prompt=text, prompt_len=len(ids), output_len=rng.randint(*output_len), user=text))
    return out


def sample_generated_shared_prefix(tok: Any, groups: int, prompts_per_group: int, system_len: int,
                                   question_len: int, output_len: int, seed: int = 0) -> list[BenchRequest]:
    """SGLang's generated-shared-prefix workload: ``groups`` × ``prompts_per_group`` prompts."""
    rng, tm = random.Random(seed), TextMaker(tok)
    out = []
    for g in range(groups):
        sys_ids = tm.ids(rng, system_len)
        for _ in range(prompts_per_group):
            q_ids = tm.ids(rng, question_len)
            out.append(BenchRequest(prompt=tm.text(sys_ids + q_ids), prompt_len=system_len + question_len,
                                    output_len=output_len, system=tm.text(sys_ids), user=tm.text(q_ids), group=g))
    return out


def sample_multi_turn(tok: Any, conversations: int, turns: int, turn_len: tuple[int, int], output_len: int,
                      seed: int = 0) -> list[BenchRequest]:
    """``conversations`` × ``turns`` user messages, ordered conversation by conversation; the
    ``prompt`` / ``prompt_len`` of a turn > 0 are only its new message (the history is added live)."""
    rng, tm = random.Random(seed), TextMaker(tok)
    out = []
    for c in range(conversations):
        for t in range(turns):
            ids = tm.ids(rng, rng.randint(*turn_len))
            text = tm.text(ids)
            out.append(BenchRequest(prompt=text, prompt_len=len(ids), output_len=output_len, user=text,
                                    conversation=c, turn=t))
    return out


_NAMES = ["name", "city", "color", "animal", "count", "score", "ok", "level", "size", "mood"]


def random_schema(rng: random.Random) -> dict:
    """A small object schema with 2–4 required, bounded properties (so outputs stay short)."""
    props: dict[str, dict] = {}
    for name in rng.sample(_NAMES, rng.randint(2, 4)):
        kind = rng.choice(["string", "integer", "boolean", "enum"])
        if kind == "string":
            props[name] = {"type": "string", "minLength": 1, "maxLength": 8, "pattern": "^[a-z]+$"}
        elif kind == "integer":
            props[name] = {"type": "integer", "minimum": 0, "maximum": 999}
        elif kind == "boolean":
            props[name] = {"type": "boolean"}
        else:
            props[name] = {"type": "string", "enum": rng.sample(["red", "blue", "green", "big", "small", "sad"], 3)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def sample_json_schema(tok: Any, num_prompts: int, input_len: tuple[int, int], output_len: int,
                       seed: int = 0) -> list[BenchRequest]:
    """Prompts = an instruction naming the fields + random filler words; one schema per prompt."""
    rng, tm = random.Random(seed), TextMaker(tok)
    out = []
    for _ in range(num_prompts):
        schema = random_schema(rng)
        head = "Answer with a JSON object with the fields " + ", ".join(schema["properties"]) + "."
        filler = tm.text(tm.ids(rng, max(0, rng.randint(*input_len) - tm.count(head))))
        text = head + " " + filler if filler else head
        out.append(BenchRequest(prompt=text, prompt_len=tm.count(text), output_len=output_len, user=text,
                                json_schema=schema, ignore_eos=False))
    return out


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


_DATE = {"type": "string", "pattern": "^2027-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])$", "description": "YYYY-MM-DD"}
TOOLS = [
    _tool("get_weather", "Get the current weather and today's forecast for a city.",
          {"city": {"type": "string", "maxLength": 32, "description": "city name, e.g. Paris"},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city", "unit"]),
    _tool("search_flights", "Search one-way flights between two airports on a date.",
          {"origin": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code of the departure airport"},
           "destination": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code of the arrival airport"},
           "date": _DATE, "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
          ["origin", "destination", "date", "passengers"]),
    _tool("create_calendar_event", "Create an event in the user's calendar.",
          {"title": {"type": "string", "maxLength": 48}, "date": _DATE,
           "start_time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$", "description": "HH:MM"},
           "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480},
           "attendees": {"type": "array", "items": {"type": "string", "maxLength": 32}, "maxItems": 4}},
          ["title", "date", "start_time", "duration_minutes"]),
    _tool("get_stock_price", "Get the latest trading price of a stock.",
          {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$", "description": "ticker symbol, e.g. AAPL"}},
          ["ticker"]),
]
TOOL_SYSTEM = "You are a helpful assistant. Use the tools to answer; call a tool whenever it can help."
_CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver", "Seoul", "Madrid", "Nairobi", "Toronto"]
_AIRPORTS = ["CDG", "JFK", "LHR", "NRT", "SFO", "DXB", "SIN", "GRU", "FRA", "SYD"]
_TICKERS = ["AAPL", "MSFT", "NVDA", "AMZN", "TSLA", "IBM", "ORCL", "INTC"]
_EVENTS = ["team sync", "dentist", "lunch with Sam", "project review", "yoga class", "call with the bank"]


def _tool_ask(rng: random.Random) -> str:
    day = f"2027-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    kind = rng.randrange(4)
    if kind == 0:
        return f"What's the weather like in {rng.choice(_CITIES)} right now, in {rng.choice(['celsius', 'fahrenheit'])}?"
    if kind == 1:
        a, b = rng.sample(_AIRPORTS, 2)
        return f"Find me a flight from {a} to {b} on {day} for {rng.randint(1, 4)} people."
    if kind == 2:
        return (f"Put '{rng.choice(_EVENTS)}' in my calendar on {day} at {rng.randint(8, 18):02d}:"
                f"{rng.choice(['00', '30'])} for {rng.choice([15, 30, 45, 60, 90])} minutes.")
    return f"How much is {rng.choice(_TICKERS)} trading at?"


def sample_tool_calls(tok: Any, num_prompts: int, output_len: int, seed: int = 0) -> list[BenchRequest]:
    """``num_prompts`` tool-use requests (system + user message, ``TOOLS``); ``prompt_len`` counts the
    two messages only (the server's count adds the template and the rendered tools)."""
    rng, tm = random.Random(seed), TextMaker(tok)
    out = []
    for _ in range(num_prompts):
        user = _tool_ask(rng)
        out.append(BenchRequest(prompt=f"{TOOL_SYSTEM}\n{user}", prompt_len=tm.count(TOOL_SYSTEM) + tm.count(user),
                                output_len=output_len, user=user, system=TOOL_SYSTEM, ignore_eos=False,
                                tools=TOOLS))
    return out


_PEOPLE = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lea"]
_COPY_CITIES = ["Lisbon", "Oslo", "Lima", "Quito", "Cairo", "Hanoi", "Perth", "Riga", "Tunis", "Accra"]
_CODE_FILES = ("radix_cache/page_pool.py", "radix_cache/radix_cache.py", "managers/kv_manager.py",
               "managers/schedule_batch.py", "srt/forward_batch.py", "kernels/sampling.py")


def _copy_json(rng: random.Random) -> tuple[str, str]:
    recs = [{"id": i, "name": n, "city": rng.choice(_COPY_CITIES), "age": rng.randint(18, 90), "active": rng.random() < 0.5}
            for i, n in enumerate(rng.sample(_PEOPLE, rng.randint(4, 7)))]
    doc = json.dumps(recs, indent=2)
    who = rng.choice(recs)
    field_, value = rng.choice([("age", rng.randint(18, 90)), ("city", json.dumps(rng.choice(_COPY_CITIES)))])
    return doc, f"Input JSON:\n{doc}\n\nThe same JSON with the {field_} of {who['name']} changed to {value}:\n"


def _copy_code(rng: random.Random) -> tuple[str, str]:
    lines = (REPO / rng.choice(_CODE_FILES)).read_text().splitlines()
    start = rng.randrange(max(1, len(lines) - 30))
    doc = "\n".join(lines[start:start + rng.randint(15, 30)])
    names = sorted({w for w in re.findall(r"\b[a-z_]{4,}\b", doc)}) or ["self"]
    old = rng.choice(names)
    return doc, (f"Original code:\n```python\n{doc}\n```\n\nThe same code with `{old}` renamed to "
                 f"`{old}_v2`:\n```python\n")


def _copy_quote(rng: random.Random) -> tuple[str, str]:
    text = (REPO / "docs" / "architecture.md").read_text()
    paras = [p.strip() for p in text.split("\n\n") if 300 <= len(p.strip()) <= 1500 and not p.startswith(("|", "```"))]
    doc = rng.choice(paras)
    return doc, f"Passage:\n{doc}\n\nQuestion: what does the passage say? Quote it word for word.\nQuote:\n"


def sample_copy_edit(tok: Any, num_prompts: int, output_len: int, seed: int = 0) -> list[BenchRequest]:
    """``num_prompts`` copy-heavy prompts (JSON rewrite, code edit, quote; in turn)."""
    rng, tm = random.Random(seed), TextMaker(tok)
    makers = (_copy_json, _copy_code, _copy_quote)
    out = []
    for i in range(num_prompts):
        doc, text = makers[i % len(makers)](rng)
        out.append(BenchRequest(prompt=text, prompt_len=tm.count(text), output_len=min(output_len, tm.count(doc) + 8),
                                user=text, extra={"kind": makers[i % len(makers)].__name__[6:]}))
    return out


def add_dataset_args(ap: argparse.ArgumentParser) -> None:
    """The dataset flags (SGLang-like names)."""
    g = ap.add_argument_group("dataset")
    g.add_argument("--dataset-name", choices=DATASETS, default="random")
    g.add_argument("--num-prompts", type=int, default=64, help="random / json-schema / tool-calls: number of prompts")
    g.add_argument("--random-input-len", type=int, nargs=2, default=[64, 512], metavar=("MIN", "MAX"))
    g.add_argument("--random-output-len", type=int, nargs=2, default=[32, 128], metavar=("MIN", "MAX"))
    g.add_argument("--gsp-num-groups", type=int, default=8)
    g.add_argument("--gsp-prompts-per-group", type=int, default=16)
    g.add_argument("--gsp-system-prompt-len", type=int, default=512)
    g.add_argument("--gsp-question-len", type=int, default=32)
    g.add_argument("--gsp-output-len", type=int, default=32)
    g.add_argument("--mt-conversations", type=int, default=8)
    g.add_argument("--mt-turns", type=int, default=4)
    g.add_argument("--mt-turn-len", type=int, nargs=2, default=[32, 64], metavar=("MIN", "MAX"))
    g.add_argument("--mt-output-len", type=int, default=32)
    g.add_argument("--json-input-len", type=int, nargs=2, default=[32, 128], metavar=("MIN", "MAX"))
    g.add_argument("--json-output-len", type=int, default=96)
    g.add_argument("--tool-output-len", type=int, default=128, help="tool-calls: max output tokens per request")
    g.add_argument("--copy-output-len", type=int, default=256, help="copy-edit: max output tokens per prompt")


def build_dataset(args: argparse.Namespace, tok: Any) -> list[BenchRequest]:
    """The requests for ``args.dataset_name`` (flags from ``add_dataset_args``; ``args.seed``)."""
    name, seed = args.dataset_name, args.seed
    if name == "random":
        return sample_random(tok, args.num_prompts, tuple(args.random_input_len), tuple(args.random_output_len), seed)
    if name == "generated-shared-prefix":
        return sample_generated_shared_prefix(tok, args.gsp_num_groups, args.gsp_prompts_per_group,
                                              args.gsp_system_prompt_len, args.gsp_question_len,
                                              args.gsp_output_len, seed)
    if name == "multi-turn":
        return sample_multi_turn(tok, args.mt_conversations, args.mt_turns, tuple(args.mt_turn_len),
                                 args.mt_output_len, seed)
    if name == "json-schema":
        return sample_json_schema(tok, args.num_prompts, tuple(args.json_input_len), args.json_output_len, seed)
    if name == "tool-calls":
        return sample_tool_calls(tok, args.num_prompts, args.tool_output_len, seed)
    if name == "copy-edit":
        return sample_copy_edit(tok, args.num_prompts, args.copy_output_len, seed)
    raise ValueError(f"unknown dataset {name!r}")


def describe(args: argparse.Namespace) -> dict:
    """The dataset's parameters, for the JSON / the table header."""
    keys = {"random": ("num_prompts", "random_input_len", "random_output_len"),
            "generated-shared-prefix": ("gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len",
                                        "gsp_question_len", "gsp_output_len"),
            "multi-turn": ("mt_conversations", "mt_turns", "mt_turn_len", "mt_output_len"),
            "json-schema": ("num_prompts", "json_input_len", "json_output_len"),
            "tool-calls": ("num_prompts", "tool_output_len"),
            "copy-edit": ("num_prompts", "copy_output_len")}[args.dataset_name]
    return {"name": args.dataset_name, "seed": args.seed, **{k: getattr(args, k) for k in keys}}
