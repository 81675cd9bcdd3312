"""The synthetic workloads: deterministic from the seed, exact token lengths, exact shared-prefix
structure, multi-turn, json-schema and tool-calls shapes."""

from __future__ import annotations

import argparse

import pytest


def _args(ds, **kw) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ds.add_dataset_args(ap)
    args = ap.parse_args([])
    args.seed = 0
    for k, v in kw.items():
        setattr(args, k, v)
    return args


@pytest.mark.parametrize("name", ["random", "generated-shared-prefix", "multi-turn", "json-schema", "tool-calls"])
def test_same_seed_same_prompts(ds, stories_tok, name):
    small = dict(num_prompts=6, gsp_num_groups=2, gsp_prompts_per_group=3, gsp_system_prompt_len=40,
                 mt_conversations=2, mt_turns=2)
    a = ds.build_dataset(_args(ds, dataset_name=name, **small), stories_tok)
    b = ds.build_dataset(_args(ds, dataset_name=name, **small), stories_tok)
    c = ds.build_dataset(_args(ds, dataset_name=name, **small, seed=1), stories_tok)
    assert a == b
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_random_lengths_exact_and_in_range(ds, stories_tok):
    reqs = ds.sample_random(stories_tok, 20, (5, 60), (3, 9), seed=3)
    assert len(reqs) == 20
    for r in reqs:
        assert 5 <= r.prompt_len <= 60 and 3 <= r.output_len <= 9 and r.ignore_eos
        assert len(stories_tok.encode(r.prompt, add_special_tokens=False)) == r.prompt_len


def test_shared_prefix_structure(ds, stories_tok):
    G, P, S, Q = 3, 4, 50, 7
    reqs = ds.sample_generated_shared_prefix(stories_tok, G, P, S, Q, 5, seed=0)
    assert len(reqs) == G * P
    enc = [stories_tok.encode(r.prompt, add_special_tokens=False) for r in reqs]
    assert all(len(e) == S + Q == r.prompt_len and r.output_len == 5 for e, r in zip(enc, reqs))
    for g in range(G):
        group = enc[g * P:(g + 1) * P]
        assert all(r.group == g for r in reqs[g * P:(g + 1) * P])
        assert all(e[:S] == group[0][:S] for e in group)  # one shared system prompt per group
        assert len({tuple(e[S:]) for e in group}) == P  # distinct questions
        assert stories_tok.encode(reqs[g * P].system, add_special_tokens=False) == group[0][:S]
    assert len({tuple(e[:S]) for e in enc}) == G  # different groups, different prefixes


def test_multi_turn_shape(ds, stories_tok):
    reqs = ds.sample_multi_turn(stories_tok, 3, 4, (4, 9), 6, seed=0)
    assert [(r.conversation, r.turn) for r in reqs] == [(c, t) for c in range(3) for t in range(4)]
    assert all(4 <= r.prompt_len <= 9 for r in reqs)


def test_json_schema_requests(ds, stories_tok):
    jsonschema = pytest.importorskip("jsonschema")
    reqs = ds.sample_json_schema(stories_tok, 8, (20, 40), 64, seed=0)
    for r in reqs:
        jsonschema.Draft202012Validator.check_schema(r.json_schema)
        assert not r.ignore_eos and r.prompt_len == len(stories_tok.encode(r.prompt, add_special_tokens=False))
        assert all(name in r.prompt for name in r.json_schema["properties"])


def test_tool_calls_requests(ds, stories_tok):
    jsonschema = pytest.importorskip("jsonschema")
    reqs = ds.sample_tool_calls(stories_tok, 12, 96, seed=0)
    names = [t["function"]["name"] for t in ds.TOOLS]
    assert names == ["get_weather", "search_flights", "create_calendar_event", "get_stock_price"]
    for tool in ds.TOOLS:
        jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
    for r in reqs:
        assert r.tools == ds.TOOLS and r.system == ds.TOOL_SYSTEM and r.user and not r.ignore_eos
        assert r.output_len == 96 and r.prompt_len > 0
    assert len({r.user for r in reqs}) > 6  # varied requests


def test_smollm2_tokenizer_lengths_exact(ds):
    try:
        tok = ds.load_tokenizer("smollm2")
    except Exception as e:  # the demo model is not on this machine
        pytest.skip(f"SmolLM2 not available: {e}")
    for r in ds.sample_generated_shared_prefix(tok, 2, 2, 64, 8, 4, seed=0):
        ids = tok.encode(r.prompt, add_special_tokens=False)
        assert len(ids) == 72 and ids[:64] == tok.encode(r.system, add_special_tokens=False)
