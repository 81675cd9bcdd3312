"""JSON-schema constrained decoding vs unconstrained decoding of the same length, and compile time.

For each backend: batch 1 and 16, greedy, the same prompts; the unconstrained run is forced to the
same number of output tokens as the constrained one (min/max_new_tokens), so the ratio is the cost
per output token of the grammar (bitmask fill + apply + accept). Also compile time per schema.

    python benchmarks/bench_grammar.py --model smollm2 --backends xgrammar outlines
"""

from __future__ import annotations

import argparse
import json
import time

from common import print_table, resolve_model, write_json

from radixlm.srt.engine import Engine

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
                                      "population": {"type": "integer", "minimum": 0}}, "required": ["city", "population"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}},
     "required": ["tags"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number"}}, "required": ["ok", "score"],
     "additionalProperties": False},
]
PROMPT = "Describe a person as JSON:"


def run(engine: Engine, bs: int, schema: dict, max_new: int) -> tuple[float, int, float]:
    prompts = [PROMPT + f" #{i}" for i in range(bs)]
    sp = {"temperature": 0, "max_new_tokens": max_new, "json_schema": json.dumps(schema)}
    engine.generate(prompts, sp)  # compile + warm
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, sp)
    t_con = time.perf_counter() - t0
    n = [o["meta_info"]["completion_tokens"] for o in outs]
    engine.flush_cache()
    plain = [{"temperature": 0, "max_new_tokens": k, "min_new_tokens": k} for k in n]
    t0 = time.perf_counter()
    engine.generate(prompts, plain)
    t_plain = time.perf_counter() - t0
    engine.flush_cache()
    return t_con, sum(n), t_plain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="stories260k")
    ap.add_argument("--backends", nargs="+", default=["xgrammar", "outlines"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--output", default="bench_results/bench_grammar.json")
    args = ap.parse_args()
    rows, compile_rows = [], []
    for backend in args.backends:
        engine = Engine(resolve_model(args.model), grammar_backend=backend, max_total_tokens=16384)
        be = engine.scheduler.grammar_backend
        from radixlm.constrained import GrammarSpec

        for i, schema in enumerate(SCHEMAS):
            t0 = time.perf_counter()
            be.compile(GrammarSpec.json_schema(schema))
            compile_rows.append({"backend": backend, "schema": i, "compile_ms": 1000 * (time.perf_counter() - t0)})
        for bs in args.batch_sizes:
            t_con = t_plain = 0.0
            tokens = 0
            for schema in SCHEMAS:
                c, n, p = run(engine, bs, schema, args.max_new_tokens)
                t_con, t_plain, tokens = t_con + c, t_plain + p, tokens + n
            rows.append({"backend": backend, "batch": bs, "output_tokens": tokens,
                         "constrained_ms_per_tok": 1000 * t_con / tokens, "unconstrained_ms_per_tok": 1000 * t_plain / tokens,
                         "ratio": t_con / t_plain})
        engine.shutdown()
    print_table(rows, ["backend", "batch", "output_tokens", "constrained_ms_per_tok", "unconstrained_ms_per_tok", "ratio"])
    print_table(compile_rows, ["backend", "schema", "compile_ms"])
    write_json(args.output, {"benchmark": "bench_grammar", "model": args.model, "rows": rows, "compile": compile_rows})


if __name__ == "__main__":
    main()
