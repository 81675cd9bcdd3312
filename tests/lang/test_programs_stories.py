"""Program mechanics against a live stories260K server: forks, multi-turn reuse, batches,
streaming, select scoring, constraints, errors, and the in-process Engine backend."""

import asyncio
import re

import pytest

import radixlm.lang as rl

from .conftest import require_regex

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
         "with her friends. One day, she saw a big red ball under a tree.")


def test_fork4_branches_reuse_the_prefilled_prefix(stories):
    @rl.function
    def branches(s):
        s += STORY
        forks = s.fork(4)
        forks += lambda i: [" She", " Lily", " The ball", " Her mom"][i]
        forks += rl.gen("more", max_tokens=4)
        forks.join()

    assert stories.flush_cache()
    state = branches.run(backend=stories, temperature=0)
    assert state.error() is None
    prefix_tokens = stories.cache_prefix(STORY)["prompt_tokens"]
    metas = state.get_meta_info("more")
    assert len(state["more"]) == 4 and all(isinstance(x, str) for x in state["more"])
    for meta in metas:
        # Everything but the branch's own words came from the cache (a match never covers the
        # last prompt token, so the prefix's last token may be recomputed).
        assert prefix_tokens - 1 <= meta["cached_tokens"] < meta["prompt_tokens"]


def _leading_space_kept(endpoint) -> bool:
    out = endpoint.request({"text": "Once upon a time, there", "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    return out["text"].startswith(" ")


def test_three_turn_program_reuses_the_previous_turns_output(stories):
    if not _leading_space_kept(stories):
        pytest.xfail("server drops the leading space of a SentencePiece completion, so re-sent text "
                     "tokenizes differently from the generated ids (detokenizer needs prompt context)")

    @rl.function
    def chat(s):
        s += STORY
        for i in range(3):
            s += rl.user("Tell me more.")
            s += rl.assistant(rl.gen(f"turn{i}", max_tokens=6))

    state = chat.run(backend=stories, temperature=0)
    assert len(state.messages()) == 6
    metas = [state.get_meta_info(f"turn{i}") for i in range(3)]
    for prev, cur in zip(metas, metas[1:]):
        # The previous prompt and its generated tokens (but maybe the last) were served from the tree.
        assert cur["cached_tokens"] >= prev["prompt_tokens"] + prev["completion_tokens"] - 1


def test_run_batch_of_64_in_order_with_an_isolated_failure(stories, capsys):
    @rl.function
    def tell(s, i):
        s += STORY  # constant: traced and prefilled once before the threads start
        s += f" Then {i} friends"
        s += rl.gen("next", max_tokens=2, top_p=2.0 if i == 17 else None)  # 17: the server says 400
        return i

    assert stories.flush_cache()
    states = tell.run_batch([{"i": i} for i in range(64)], backend=stories, temperature=0, progress_bar=True)
    assert "64/64" in capsys.readouterr().err  # the tqdm bar
    assert [s.ret_value for s in states] == list(range(64))
    assert isinstance(states[17].error(), rl.BackendError) and states[17].error().status_code == 400
    for i, s in enumerate(states):
        if i != 17:
            assert s.error() is None and s.text().startswith(f"{STORY} Then {i} friends")
            assert s.get_meta_info("next")["completion_tokens"] == 2
    # The constant prefix (STORY) was traced and prefilled once before the threads started, so
    # every program found it in the cache.
    prefix_tokens = stories.cache_prefix(STORY)["prompt_tokens"]
    cached = [s.get_meta_info("next")["cached_tokens"] for i, s in enumerate(states) if i != 17]
    assert min(cached) >= prefix_tokens - 1, (prefix_tokens, cached)


def test_streaming_text_iter_equals_the_final_text(stories):
    @rl.function
    def story(s):
        s += "Once upon a time"
        s += rl.gen("a", max_tokens=12)
        s += ". The end"

    state = story.run(backend=stories, stream=True, temperature=0)
    chunks = list(state.text_iter())
    # How many chunks the consumer sees depends on thread scheduling (a late consumer gets the text
    # coalesced); the server's token-by-token SSE is checked in tests/server/test_generate.py.
    assert chunks and all(chunks) and "".join(chunks) == state.text()
    assert state.text().startswith("Once upon a time") and state.text().endswith(". The end")
    state = story.run(backend=stories, stream=True, temperature=0)
    assert "".join(state.text_iter("a")) == state["a"]

    async def collect():
        s = story.run(backend=stories, stream=True, temperature=0)
        return [c async for c in s.text_async_iter()], s

    chunks, s = asyncio.run(collect())
    assert "".join(chunks) == s.text()


def test_select_scores_a_choice_merged_with_the_prefix(stories):
    @rl.function
    def pick(s, method):
        s += "Once upon a ti"
        s += rl.select("end", choices=["me", "ger", "red"], choices_method=method)

    for method in (rl.token_length_normalized, rl.greedy_token_selection, rl.unconditional_likelihood_normalized):
        state = pick.run(backend=stories, method=method)
        assert state["end"] == "me", method
        meta = state.get_meta_info("end")
        assert len(meta["normalized_prompt_logprobs"]) == 3
        me_tokens = meta["input_token_logprobs"][0]
        assert [t[2].strip() for t in me_tokens] == ["time"]  # "ti" + "me" re-tokenized as one token
    assert meta["unconditional_token_logprobs"] is not None


def test_min_tokens_stop_and_logprobs(stories):
    @rl.function
    def prog(s):
        s += "Once upon a time"
        s += rl.gen("long", min_tokens=10, max_tokens=12, ignore_eos=False)
        s += "\nThe"
        s += rl.gen("short", max_tokens=30, stop=".", return_logprob=True, top_logprobs_num=2)

    state = prog.run(backend=stories, temperature=0)
    assert state.get_meta_info("long")["completion_tokens"] >= 10
    assert "." not in state["short"]
    meta = state.get_meta_info("short")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_n_samples_and_stop_regex_on_the_server(stories):
    @rl.function
    def prog(s):
        s += "Once upon a time"
        s += rl.gen("many", n=3, max_tokens=6, temperature=1.0, sampling_seed=7)
        s += " She said"
        s += rl.gen("cut", max_tokens=40, stop_regex=r"\b(the|a)\b")

    state = prog.run(backend=stories, temperature=0)
    assert state.error() is None, state.error()
    many, metas = state["many"], state.get_meta_info("many")
    assert isinstance(many, list) and len(many) == len(metas) == 3 and len(set(many)) > 1  # seeds 7, 8, 9
    assert state.text().startswith("Once upon a time" + many[0] + " She said")
    meta = state.get_meta_info("cut")
    assert meta["finish_reason"]["type"] == "stop" and re.search(r"\b(the|a)$", state["cut"]), state["cut"]


def test_regex_and_dtype_gens(stories):
    require_regex(stories)
    ipv4 = r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

    @rl.function
    def prog(s):
        s += "The address is " + rl.gen("ip", regex=ipv4, max_tokens=20) + ". She was "
        s += rl.gen_int("age", max_tokens=4) + " years old."

    state = prog.run(backend=stories, temperature=0)
    assert re.fullmatch(ipv4, state["ip"]), state["ip"]
    int(state["age"])


def test_server_errors_surface_in_the_state(stories):
    @rl.function
    def bad(s):
        s += "Once upon a time" + rl.gen("x", top_p=2.0)
        s += rl.gen("y", max_tokens=2)

    state = bad.run(backend=stories)
    assert isinstance(state.error(), rl.BackendError) and state.error().status_code == 400
    with pytest.raises(rl.ProgramError):
        state["y"]
    streamed = bad.run(backend=stories, stream=True)  # the same error, read from the stream
    assert "".join(streamed.text_iter()) == "Once upon a time"
    assert isinstance(streamed.error(), rl.BackendError) and str(streamed.error()) == str(state.error())
    assert streamed.error().status_code == 400


def test_in_process_engine_matches_the_server(stories, stories_path):
    engine = rl.Engine(stories_path, dtype="float32", max_total_tokens=4000)

    @rl.function
    def prog(s):
        s += "Once upon a time"
        forks = s.fork(2)
        forks += lambda i: [", there", " a dog"][i]
        forks += rl.gen("x", max_tokens=6)
        forks.join()
        s += rl.select("pick", choices=[" happy", " sad"])

    local, remote = prog.run(backend=engine, temperature=0), prog.run(backend=stories, temperature=0)
    assert local.error() is None and local["x"] == remote["x"] and local["pick"] == remote["pick"]
    assert engine.generate(prompt="Once upon a time", sampling_params={"max_new_tokens": 0})["meta_info"]["prompt_tokens"] == 5
    info = rl.get_server_info(engine)  # was {}: the in-process backend had no get_server_info
    assert info["max_total_num_tokens"] > 0 and info["internal_state"]["num_running_reqs"] == 0

    @rl.function
    def scored(s):  # a gen's logprobs with token text, as the server gives them (the Engine gave None)
        s += "Once upon a time" + rl.gen("y", max_tokens=4, return_logprob=True, top_logprobs_num=2,
                                         return_text_in_logprobs=True)

    local, remote = scored.run(backend=engine, temperature=0), scored.run(backend=stories, temperature=0)
    want, got = remote.get_meta_info("y"), local.get_meta_info("y")
    for key in ("output_token_logprobs", "output_top_logprobs"):
        assert len(got[key]) == len(want[key]) == 4
    for (lp, tid, text), (wlp, wtid, wtext) in zip(got["output_token_logprobs"], want["output_token_logprobs"]):
        assert tid == wtid and text == wtext and text is not None
        assert abs(lp - wlp) < 0.02  # the fixture's server runs --dtype auto (bf16 on a CPU with bf16 units)
    assert [[e[1:] for e in top] for top in got["output_top_logprobs"]] == \
        [[e[1:] for e in top] for top in want["output_top_logprobs"]]


def test_in_process_engine_streams_step_by_step(stories_path):
    engine = rl.Engine(stories_path, dtype="float32", max_total_tokens=4000)

    @rl.function
    def story(s):
        s += "Once upon a time" + rl.gen("x", max_tokens=16, temperature=0)

    chunks = list(story.run(backend=engine, stream=True).text_iter("x"))
    assert len(chunks) > 3 and "".join(chunks) == story.run(backend=engine)["x"]

    @rl.function
    def lookahead(s):  # a regex the grammar backend cannot compile: a 400, as from a server
        s += "Answer:" + rl.gen("x", max_tokens=4, regex="(?=a)a")

    for state in (lookahead.run(backend=engine), lookahead.run(backend=engine, stream=True)):
        list(state.text_iter())
        assert isinstance(state.error(), rl.BackendError) and state.error().status_code == 400
        assert "ookahead" in str(state.error())
    engine.shutdown()
