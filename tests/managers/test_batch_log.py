"""The scheduler's SGLang-style batch log lines (managers/batch_log.py): exact wording and numbers with
a fake clock, and the counts a real scheduler reports (stories260K in process)."""

from __future__ import annotations

import logging
import re

import pytest

from radixlm.managers.batch_log import BatchLog


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_and_throughput_window(caplog):
    clock = Clock()
    log = BatchLog(2, 1000, clock)
    with caplog.at_level(logging.INFO, logger="radixlm.managers.batch_log"):
        log.extend(3, 96, 64, 250, 1, 4)
        log.generated_tokens(3)  # the extend's first tokens count toward the next decode line
        clock.t += 1.0
        log.generated_tokens(5)
        log.decode(5, 300, 0)  # step 1 of 2: no line
        clock.t += 1.0
        log.generated_tokens(5)
        assert log.gen_throughput == 0.0
        log.decode(5, 306, 1)
        assert log.gen_throughput == 6.5  # what /metrics' radixlm:gen_throughput shows until the next line
        clock.t += 0.5
        log.generated_tokens(4)
        log.decode(4, 309, 0)
        log.generated_tokens(4)
        clock.t += 0.5
        log.decode(4, 313, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "Prefill batch. #new-seq: 3, #new-token: 96, #cached-token: 64, token usage: 0.25, #running-req: 1, #queue-req: 4",
        "Decode batch. #running-req: 5, #token: 306, token usage: 0.31, gen throughput (token/s): 6.50, #queue-req: 1",
        "Decode batch. #running-req: 4, #token: 313, token usage: 0.31, gen throughput (token/s): 8.00, #queue-req: 0",
    ]


def test_bad_arguments():
    with pytest.raises(ValueError, match="decode_log_interval"):
        BatchLog(0, 100)
    with pytest.raises(ValueError, match="total_tokens"):
        BatchLog(1, 0)


def test_a_scheduler_reports_its_batches(stories_path, caplog):
    from radixlm import Engine

    engine = Engine(stories_path, dtype="float32", max_total_tokens=4096, decode_log_interval=2, page_size=1)
    try:
        first = list(range(5, 45))  # 40 tokens, cached after its request
        engine.generate(input_ids=[first], sampling_params={"max_new_tokens": 1, "temperature": 0})
        prompts = [first + [50, 51, 52], list(range(100, 130))]
        with caplog.at_level(logging.INFO, logger="radixlm.managers.batch_log"):
            engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 5, "temperature": 0,
                                                                "ignore_eos": True})
    finally:
        engine.shutdown()
    lines = [r.getMessage() for r in caplog.records]
    prefill = [line for line in lines if line.startswith("Prefill batch.")]
    # one batch: both prompts; 40 tokens of the first from the cache, so 3 + 30 computed
    assert prefill == [f"Prefill batch. #new-seq: 2, #new-token: 33, #cached-token: 40, token usage: "
                       f"{(40 + 3 + 30) / 4096:.2f}, #running-req: 0, #queue-req: 0"], lines
    decode = [line for line in lines if line.startswith("Decode batch.")]
    assert len(decode) == 2  # 4 decode steps (tokens 2-5 of each request), a line every 2
    m = re.fullmatch(r"Decode batch\. #running-req: 2, #token: (\d+), token usage: [\d.]+, "
                     r"gen throughput \(token/s\): ([\d.]+), #queue-req: 0", decode[0])
    assert m and float(m.group(2)) > 0, decode
    assert int(m.group(1)) >= 40 + 3 + 30 + 2 * 2  # the prompts' slots plus what decoding added


def test_the_flag_refuses_a_non_positive_interval():
    from radixlm.srt.server_args import ServerArgs, ServerArgsError

    assert ServerArgs.from_kwargs().decode_log_interval == 40  # SGLang's default
    for bad in (0, -3):
        with pytest.raises(ServerArgsError, match=r"^--decode-log-interval must be >= 1$"):
            ServerArgs.from_kwargs(decode_log_interval=bad)
