"""``--enable-mixed-chunk`` (SGLang's flag): the running requests take their decode step inside each
extend batch, so a long prompt's chunks do not pause them (an operator saw a 17.7 s gap in a stream
while a 7,000-token prompt was prefilled). Driven step by step on stories260K in fp32: the decoding
request gains one token in every chunk's step, and both outputs equal their solo greedy runs."""

from __future__ import annotations

import pytest

from radixlm.managers.io_struct import TokenizedGenerateReq
from radixlm.srt.engine import Engine
from radixlm.srt.sampling_params import SamplingParams
from radixlm.srt.server_args import ServerArgsError
from tests.engine.test_greedy_vs_hf import assert_clean

SHORT = [3 + i for i in range(6)]
LONG = [3 + (7 * i) % 400 for i in range(150)]  # ten chunks of 16 (14 once the decode token rides along)


def _msg(rid: str, ids: list[int], max_new: int) -> TokenizedGenerateReq:
    sp = SamplingParams.from_dict({"temperature": 0, "ignore_eos": True, "max_new_tokens": max_new})
    return TokenizedGenerateReq(rid=rid, input_ids=ids, sampling_params=sp)


def _outputs_while_a_long_prompt_prefills(mixed: bool, stories_path: str) -> tuple[list[int], dict, Engine]:
    """Per step of the long prompt's prefill: how many tokens the short request has; final outputs."""
    engine = Engine(stories_path, dtype="float32", max_total_tokens=2048, chunked_prefill_size=16,
                    enable_mixed_chunk=mixed)
    sched = engine.scheduler
    done: dict[str, list[int]] = {}
    sched.send_output = lambda out: [done.setdefault(rid, []).extend(out.output_ids[i])
                                     for i, rid in enumerate(out.rids)]
    sched.add_request(_msg("short", SHORT, 40))
    while not sched.running:
        sched.step()
    short = sched.running[0]
    sched.add_request(_msg("long", LONG, 8))
    progress = []
    while not any(r.rid == "long" for r in sched.running):  # the long prompt's chunks
        sched.step()
        progress.append(len(short.output_ids))
    while sched.step():
        pass
    sched.send_output = engine._outbox.append
    return progress, done, engine


def test_decoding_requests_advance_during_a_chunked_prefill(stories_path):
    progress, done, engine = _outputs_while_a_long_prompt_prefills(True, stories_path)
    assert len(progress) >= 10 and progress == list(range(progress[0], progress[0] + len(progress)))
    plain, plain_done, _ = _outputs_while_a_long_prompt_prefills(False, stories_path)
    assert len(set(plain)) == 1, "without the flag the stream waits for the whole prefill"
    solo = {rid: engine.generate(input_ids=ids, sampling_params={"temperature": 0, "ignore_eos": True,
                                                                 "max_new_tokens": n})["output_ids"]
            for rid, ids, n in (("short", SHORT, 40), ("long", LONG, 8))}
    assert done == plain_done == solo
    assert_clean(engine)


def test_the_flag_refuses_speculative_decoding():
    from radixlm.srt.server_args import ServerArgs

    with pytest.raises(ServerArgsError, match="--enable-mixed-chunk does not combine"):
        ServerArgs(model_path="m", enable_mixed_chunk=True, speculative_algorithm="NGRAM").validate()


def test_more_running_requests_than_the_prefill_budget_do_not_starve_the_queue(stories_path):
    """8 running requests, a prefill budget of 8 tokens: the waiting prompt is still admitted while
    they decode (a token a step at worst), and every output equals its solo run."""
    engine = Engine(stories_path, dtype="float32", max_total_tokens=2048, chunked_prefill_size=8,
                    max_prefill_tokens=8, enable_mixed_chunk=True)
    sched = engine.scheduler
    done: dict[str, list[int]] = {}
    sched.send_output = lambda out: [done.setdefault(rid, []).extend(out.output_ids[i])
                                     for i, rid in enumerate(out.rids)]
    shorts = {f"s{i}": [3 + i, 40 + i] for i in range(8)}
    for rid, ids in shorts.items():
        sched.add_request(_msg(rid, ids, 30))
    while len(sched.running) < 8:
        sched.step()
    sched.add_request(_msg("long", LONG[:12], 4))
    for _ in range(12):
        sched.step()
    assert not sched.waiting and min(len(r.output_ids) for r in sched.running if r.rid != "long") < 30
    while sched.step():
        pass
    sched.send_output = engine._outbox.append
    for rid, ids, n in [*((rid, ids, 30) for rid, ids in shorts.items()), ("long", LONG[:12], 4)]:
        solo = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "ignore_eos": True,
                                                               "max_new_tokens": n})
        assert done[rid] == solo["output_ids"], rid
    assert_clean(engine)
