"""Engine behaviour beyond greedy equality: cached_tokens accounting, logprobs against transformers,
seeded sampling independent of the batch, stop conditions, abort, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from radixlm.managers.io_struct import AbortReq, TokenizedGenerateReq
from radixlm.managers.validation import InvalidRequestError
from radixlm.srt.engine import Engine
from radixlm.srt.sampling_params import SamplingParams
from tests.engine.reference import hf_logits
from tests.engine.test_greedy_vs_hf import assert_clean

GREEDY = {"temperature": 0, "max_new_tokens": 8}


@pytest.fixture(scope="module")
def engine(stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=4096)


@pytest.fixture(autouse=True)
def clean_after(engine):
    yield
    assert_clean(engine)


def test_cached_tokens_sglang_sequence(engine):
    # SGLang's test_cache_tokens, scaled to a 2048-token context.
    ids = lambda n: [3 + i % 500 for i in range(n)]  # noqa: E731
    sp = {"temperature": 0, "max_new_tokens": 1}
    assert engine.generate(input_ids=ids(100), sampling_params=sp)["meta_info"]["cached_tokens"] == 0
    assert engine.generate(input_ids=ids(1000), sampling_params=sp)["meta_info"]["cached_tokens"] == 100
    assert engine.generate(input_ids=ids(1000), sampling_params=sp)["meta_info"]["cached_tokens"] == 999
    assert engine.generate(input_ids=ids(500), sampling_params=sp)["meta_info"]["cached_tokens"] == 499
    assert engine.generate(input_ids=ids(1500), sampling_params=sp)["meta_info"]["cached_tokens"] == 1000


def test_follow_up_reuses_generated_tokens(engine):
    first = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 20})
    prompt_ids = engine.tokenizer.encode("Once upon a time")
    turn2 = prompt_ids + first["output_ids"] + engine.tokenizer.encode("The end", add_special_tokens=False)
    out = engine.generate(input_ids=turn2, sampling_params=GREEDY)
    # Prompt + all generated tokens but the last (whose KV was never computed) come from the tree.
    assert out["meta_info"]["cached_tokens"] == len(prompt_ids) + 20 - 1


def test_max_new_tokens_zero_caches_prompt(engine):
    ids = engine.tokenizer.encode("The sun was shining and the birds were singing")
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    again = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == len(ids) - 1


def test_logprobs_match_hf(engine, stories_path):
    ids = engine.tokenizer.encode("Once upon a time, there was a little dog")
    out = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 5},
                          return_logprob=True, logprob_start_len=0, top_logprobs_num=3)
    meta = out["meta_info"]
    full = ids + out["output_ids"]
    ref = torch.log_softmax(hf_logits(stories_path, full), dim=-1)
    inp = meta["input_token_logprobs"]
    assert len(inp) == len(ids) and inp[0][0] is None
    for pos in range(1, len(ids)):
        assert inp[pos][1] == ids[pos]
        assert math.isclose(inp[pos][0], ref[pos - 1, ids[pos]].item(), abs_tol=1e-4)
    outp = meta["output_token_logprobs"]
    assert [t[1] for t in outp] == out["output_ids"]
    for k, (lp, tid, _) in enumerate(outp):
        assert math.isclose(lp, ref[len(ids) - 1 + k, tid].item(), abs_tol=1e-4)
        top = meta["output_top_logprobs"][k]
        assert [t[1] for t in top] == ref[len(ids) - 1 + k].topk(3).indices.tolist()


def test_input_logprobs_from_start_len_with_cached_prefix(engine):
    ids = engine.tokenizer.encode("Ben and Mia were best friends and they liked to play")
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})  # cache it all
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1}, return_logprob=True,
                          logprob_start_len=len(ids) - 2)
    inp = out["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in inp] == ids[-2:] and all(t[0] is not None for t in inp)


def test_seed_gives_same_text_in_any_batch(engine):
    sp = {"temperature": 0.9, "max_new_tokens": 16, "sampling_seed": 1234}
    alone = engine.generate("Lily went to the", sp)["output_ids"]
    others = [{"temperature": 0.9, "max_new_tokens": 16, "sampling_seed": s} for s in (1, 2, 3)]
    batch = engine.generate(["The cat", "Lily went to the", "Tom", "A bird"], [others[0], sp, others[1], others[2]])
    assert batch[1]["output_ids"] == alone
    assert len({tuple(o["output_ids"]) for o in batch}) > 1


def test_stop_string_across_tokens_is_trimmed(engine):
    full = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30})["text"]
    assert "little girl" in full
    out = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30, "stop": ["girl nam"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "girl nam"}
    assert out["text"] == full[:full.index("girl nam")]
    kept = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30, "stop": "girl nam",
                                                "no_stop_trim": True})
    assert kept["text"].endswith("girl nam") or "girl nam" in kept["text"]


def test_stop_token_ids_and_eos(engine):
    greedy = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 10})["output_ids"]
    stop_at = greedy[3]
    out = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 10, "stop_token_ids": [stop_at]})
    assert out["output_ids"] == greedy[:greedy.index(stop_at) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    # min_new_tokens masks the stop id until reached.
    longer = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 10,
                                                  "stop_token_ids": [stop_at], "min_new_tokens": 10})
    assert len(longer["output_ids"]) == 10 and stop_at not in longer["output_ids"]


def test_abort_by_rid_prefix(engine):
    sched = engine.scheduler
    for i in range(3):
        sched.add_request(TokenizedGenerateReq(rid=f"job-{i}", input_ids=[1, 400, 300],
                                               sampling_params=SamplingParams(max_new_tokens=50)))
    sched.step()
    sched.step()
    sched.handle_message(AbortReq(rid="job-"))
    while sched.step():
        pass
    outs = {}
    for batch in engine._outbox:
        for rid, fr in zip(batch.rids, batch.finished_reasons):
            if fr is not None:
                assert rid not in outs, "exactly one finish reason per request"
                outs[rid] = fr
    engine._outbox.clear()
    assert set(outs) == {"job-0", "job-1", "job-2"}
    assert all(fr.type == "abort" for fr in outs.values())


@pytest.mark.parametrize("kwargs,fragment", [
    ({"input_ids": []}, "empty"),
    ({"input_ids": [1, 99999]}, "outside the vocabulary"),
    ({"input_ids": [1, -3]}, "outside the vocabulary"),
    ({"input_ids": list(range(3, 500)) * 5}, "longer than the model's context length"),
    ({"prompt": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
    ({"prompt": "hi", "sampling_params": {"temperature": float("nan")}}, "temperature"),
    ({"prompt": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
    ({"prompt": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"prompt": "hi", "sampling_params": {"top_k": 0}}, "top_k"),
    ({"prompt": "hi", "sampling_params": {"min_p": 2}}, "min_p"),
    ({"prompt": "hi", "sampling_params": {"frequency_penalty": float("inf")}}, "frequency_penalty"),
    ({"prompt": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"input_ids": [1] * 2000, "sampling_params": {"max_new_tokens": 49}},
     r"max_new_tokens must be in \[0, 48\] for this input"),
    ({"input_ids": [[1] * 10, [1] * 2000], "sampling_params": [{}, {"max_new_tokens": 100}]}, r"\[0, 48\]"),
    ({"prompt": "hi", "sampling_params": {"bogus": 1}}, "bogus"),
    ({"prompt": "hi", "sampling_params": {"logit_bias": {"9999": 1.0}}}, "logit_bias"),
])
def test_bad_input_is_a_typed_error_and_engine_survives(engine, kwargs, fragment):
    with pytest.raises(InvalidRequestError, match=fragment):
        engine.generate(**kwargs)
    assert engine.generate("Lily", GREEDY)["meta_info"]["completion_tokens"] == 8


def test_duplicate_rids_in_one_call_are_refused(engine):
    # they merged two requests' outputs into one result each (an offline user's report)
    for kwargs in ({"prompt": ["a", "b"], "rid": ["x", "x"]},
                   {"prompt": ["a", "b"], "rid": ["x", "x"], "sampling_params": {"n": 2, **GREEDY}}):
        with pytest.raises(InvalidRequestError, match="rids must be unique"):
            engine.generate(**{"sampling_params": GREEDY, **kwargs})
    assert [r["text"] for r in engine.generate(["a", "b"], GREEDY, rid=["x", "y"])] == \
        [engine.generate("a", GREEDY)["text"], engine.generate("b", GREEDY)["text"]]


def test_an_interrupted_call_ends_its_requests(engine):
    """Ctrl-C or a timeout inside generate: the call's requests are aborted and their KV freed, so they
    neither hold the pool nor keep decoding inside later calls (they did, with no way to stop them)."""
    step, calls = engine.scheduler.step, [0]

    def interrupted_step():
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return step()

    engine.scheduler.step = interrupted_step
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate(["Once upon"] * 4, {"max_new_tokens": 500, "ignore_eos": True})
    finally:
        del engine.scheduler.step
    state = engine.get_server_info()["internal_state"]
    assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0
    assert engine.generate("Lily", GREEDY)["meta_info"]["completion_tokens"] == 8


def test_tp_size_and_calls_after_shutdown_are_refused(stories_path):
    from radixlm.srt.server_args import ServerArgsError

    with pytest.raises(ServerArgsError, match="tp_size=2"):
        Engine(stories_path, tp_size=2)
    with pytest.raises(ServerArgsError, match="max_total_tokens must be an int, got str '100'"):
        Engine(stories_path, max_total_tokens="100")  # was a raw TypeError from the comparison
    with pytest.raises(ServerArgsError, match="disable_radix_cache must be a bool"):
        Engine(stories_path, disable_radix_cache=1)
    alone = Engine(stories_path, max_total_tokens=512)
    assert alone.generate("Lily", GREEDY)["meta_info"]["completion_tokens"] == 8
    alone.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        alone.generate("Lily", GREEDY)


def test_default_max_new_tokens_is_clamped_to_the_context(engine):
    # As /generate: only an explicit max_new_tokens that cannot fit is an error; the default (128)
    # is clamped, so a prompt 1 token short of the context gets exactly one token.
    assert engine.model_config.context_len == 2048
    out = engine.generate(input_ids=[1] * 2047, sampling_params={"ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 1
    fits = engine.generate(input_ids=[1] * 2000, sampling_params={"max_new_tokens": 48, "ignore_eos": True})
    assert fits["meta_info"]["completion_tokens"] == 48


def test_stop_regex_and_empty_list(engine):
    full = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30})["text"]
    out = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30, "stop_regex": [r"girl \w+ed"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"girl \w+ed"}
    assert out["text"] == full[:full.index("girl named") + len("girl named")]
    # SGLang's frontend sends stop_regex: [] with every gen.
    same = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30, "stop_regex": []})
    assert same["text"] == full
    with pytest.raises(InvalidRequestError, match="stop_regex"):
        engine.generate("Hi", {"stop_regex": "(unclosed"})


def test_min_new_tokens_then_stop_string_keeps_forced_tokens(engine):
    full = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30})
    # The greedy text has "." after "park"; with min_new_tokens past the first "," the stop on ","
    # must come from a later occurrence, and the forced tokens stay in the text.
    first_comma = full["text"].index(",")
    out = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 30, "stop": ",",
                                               "min_new_tokens": 3})
    assert out["meta_info"]["completion_tokens"] >= 3
    assert len(out["text"]) > first_comma and out["text"] == full["text"][:len(out["text"])]
    assert not out["text"].endswith(",")


def test_n_samples_each_prompt_with_seed_plus_j(engine):
    sp = {"temperature": 0.9, "max_new_tokens": 12, "sampling_seed": 77}
    outs = engine.generate("Lily went to the", {**sp, "n": 3})
    assert isinstance(outs, list) and len(outs) == 3  # n copies, not one silently
    for j, out in enumerate(outs):
        alone = engine.generate("Lily went to the", {**sp, "sampling_seed": 77 + j})
        assert out["output_ids"] == alone["output_ids"]
    batch = engine.generate(["The cat", "Tom"], {"temperature": 0, "max_new_tokens": 4, "n": 2})
    assert len(batch) == 4 and batch[0]["output_ids"] == batch[1]["output_ids"]  # prompt-major
    with pytest.raises(InvalidRequestError, match="share n"):
        engine.generate(["a", "b"], [{"n": 2}, {"n": 1}])


def test_generate_from_several_threads(engine):
    import threading

    prompts = [f"Lily and her friend number {i} went" for i in range(4)]
    want = [engine.generate(p, GREEDY)["output_ids"] for p in prompts]
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(3):
                got[i] = engine.generate(prompts[i], GREEDY)["output_ids"]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [got[i] for i in range(4)] == want  # the autouse check then flushes a consistent pool


def test_stream_yields_the_growing_result_and_ends_as_the_plain_call(engine):
    """SGLang's ``Engine.generate(..., stream=True)``: cumulative dicts, one per step that added output."""
    params = {"temperature": 0, "max_new_tokens": 12, "stop": " was"}
    plain = engine.generate("Once upon a time", params, return_logprob=True)
    events = list(engine.generate("Once upon a time", params, return_logprob=True, stream=True))
    assert len(events) >= 2 and all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    ids = [e["output_ids"] for e in events]
    assert all(b[:len(a)] == a and len(b) >= len(a) for a, b in zip(ids, ids[1:]))
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # a stop string's prefix is held back
    last = events[-1]
    assert (last["text"], last["output_ids"]) == (plain["text"], plain["output_ids"])
    assert last["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
    assert last["meta_info"]["output_token_logprobs"] == plain["meta_info"]["output_token_logprobs"]
    with pytest.raises(InvalidRequestError, match="one prompt and n = 1"):
        engine.generate(["a", "b"], GREEDY, stream=True)
    with pytest.raises(InvalidRequestError, match="empty"):  # validated at the call, not at the first next()
        engine.generate(input_ids=[], sampling_params=GREEDY, stream=True)


def test_closing_a_stream_early_aborts_its_request(engine):
    stream = engine.generate("Lily", {"max_new_tokens": 500, "ignore_eos": True}, stream=True)
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    stream.close()
    state = engine.get_server_info()["internal_state"]
    assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0
    assert engine.generate("Lily", GREEDY)["meta_info"]["completion_tokens"] == 8  # the lock was released


def test_a_stream_refuses_calls_from_its_own_thread_and_copies_its_events(engine):
    """A call from the thread holding an open stream would step the shared scheduler and take the
    stream's outputs (its text came back with holes): it is an error; the stream goes on intact.
    Each event's logprob lists are its own (they were one list, as long as the last event's)."""
    params = {"temperature": 0, "max_new_tokens": 6}
    plain = engine.generate("Once upon a time", params, return_logprob=True)
    stream = engine.generate("Once upon a time", params, return_logprob=True, stream=True)
    first = next(stream)
    with pytest.raises(RuntimeError, match="still open in this thread"):
        engine.generate("Lily", GREEDY)
    with pytest.raises(RuntimeError, match="still open in this thread"):
        engine.generate("Lily", GREEDY, stream=True)
    events = [first, *stream]
    assert events[-1]["output_ids"] == plain["output_ids"]
    assert [len(e["meta_info"]["output_token_logprobs"]) for e in events] == [len(e["output_ids"]) for e in events]
    assert engine.generate("Lily", GREEDY)["meta_info"]["completion_tokens"] == 8


def test_a_stream_read_in_another_thread_ends_and_frees_the_engine(engine):
    """A stream opened in one thread and read (or dropped) in another: it ends there, and other
    threads' calls then run (the lock held across the stream's yields was released in the reading
    thread, which raised, and every later call from another thread hung; a newcomer's finding)."""
    import gc
    import threading

    params = {"temperature": 0, "max_new_tokens": 6}
    plain = engine.generate("Once upon a time", params)
    box, opened, done = {}, threading.Event(), threading.Event()

    def opener() -> None:
        box["stream"] = engine.generate("Once upon a time", params, stream=True)
        box["first"] = next(box["stream"])
        opened.set()
        done.wait(60)

    t = threading.Thread(target=opener)
    t.start()
    assert opened.wait(60)
    events = [box["first"], *box.pop("stream")]  # read to its end in this thread
    done.set()
    t.join(60)
    assert events[-1]["output_ids"] == plain["output_ids"] and events[-1]["meta_info"]["finish_reason"]
    results: list = []
    other = threading.Thread(target=lambda: results.append(engine.generate("Lily", GREEDY)), daemon=True)
    other.start()
    other.join(60)
    assert not other.is_alive(), "a call from another thread hung after the stream ended"
    assert results[0]["meta_info"]["completion_tokens"] == 8

    opened.clear()
    t = threading.Thread(target=lambda: (box.update(stream=engine.generate("Lily", {"max_new_tokens": 500, "ignore_eos": True},
                                                                           stream=True)),
                                         next(box["stream"]), opened.set()))
    t.start()
    t.join(60)
    assert opened.is_set()
    del box["stream"]  # dropped unfinished in this thread: its request is aborted, the engine freed
    gc.collect()
    assert engine.generate("Lily", GREEDY)["meta_info"]["completion_tokens"] == 8


def test_a_grammar_the_backend_cannot_compile_raises(engine):
    """As /generate's 400 (it returned an empty result with finish_reason abort; a newcomer's finding)."""
    bad = {"max_new_tokens": 4, "regex": "(?=a)a"}  # valid Python regex; lookahead is not supported
    with pytest.raises(InvalidRequestError, match="(?i)lookahead"):
        engine.generate("Answer:", bad)
    with pytest.raises(InvalidRequestError, match="(?i)lookahead"):
        engine.generate(["Answer:", "Lily"], [bad, GREEDY])
    with pytest.raises(InvalidRequestError, match="(?i)lookahead"):
        list(engine.generate("Answer:", bad, stream=True))
    assert engine.generate("Lily", GREEDY)["meta_info"]["completion_tokens"] == 8
