"""TokenizerManager._watch: one yield per output, none for the poll timer, the client and the deadline
checked every poll period (the timer re-armed), errors raised, unfinished rids aborted on exit.

Runs ``_watch`` on a stand-in for the manager (it only calls ``_time_out`` and ``_abort_unfinished``)
with the poll period shortened to 10 ms; outputs are simulated as ``_on_output`` makes them: the
state's ``updates`` counted up, then the shared event set.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from radixlm.managers import tokenizer_manager as tm_mod
from radixlm.managers.tokenizer_manager import ClientDisconnected, ReqState, RequestError, TokenizerManager

POLL_S = 0.01


class _Acc:
    def __init__(self) -> None:
        self.finished = False


class _Manager:
    """The two hooks ``_watch`` calls, recorded."""

    def __init__(self) -> None:
        self.timed_out: list[str] = []
        self.aborted: list[list[str]] = []

    def _time_out(self, states: list[ReqState], message: str) -> None:
        self.timed_out.append(message)

    def _abort_unfinished(self, states: list[ReqState]) -> None:
        self.aborted.append([s.msg.rid for s in states if not s.acc.finished])


def _states(n: int, created: float) -> list[ReqState]:
    event = asyncio.Event()
    return [ReqState(SimpleNamespace(rid=f"r{i}"), _Acc(), event, created) for i in range(n)]


def _output(state: ReqState, finished: bool = False) -> None:
    state.updates += 1
    state.acc.finished = finished
    state.event.set()


@pytest.fixture(autouse=True)
def short_poll(monkeypatch):
    monkeypatch.setattr(tm_mod, "_DISCONNECT_POLL_S", POLL_S)


def _watch(manager: _Manager, states: list[ReqState], is_disconnected, timeout=None):
    return TokenizerManager._watch(manager, states, is_disconnected, timeout)


def test_timer_wakes_yield_nothing_and_each_output_yields_once():
    async def main() -> tuple[list[int], int]:
        m, states = _Manager(), _states(2, time.monotonic())
        polls = [0]

        async def is_disconnected() -> bool:
            polls[0] += 1
            return False

        yields: list[int] = []

        async def consume() -> None:
            async for got in _watch(m, states, is_disconnected):
                assert got is states
                yields.append(sum(s.updates for s in states))

        task = asyncio.create_task(consume())
        await asyncio.sleep(8 * POLL_S)  # several polls, no output: nothing yielded
        assert yields == []
        _output(states[0])
        await asyncio.sleep(3 * POLL_S)
        _output(states[0], finished=True)
        _output(states[1])  # two outputs before the consumer runs: one wake, one yield
        await asyncio.sleep(3 * POLL_S)
        _output(states[1], finished=True)
        await asyncio.wait_for(task, 5)
        assert m.aborted == [[]]  # all finished: nothing to abort
        return yields, polls[0]

    yields, polls = asyncio.run(main())
    assert yields == [1, 3, 4]
    assert polls >= 4  # the timer was re-armed after each poll


def test_disconnected_client_raises_and_aborts_the_unfinished():
    async def main() -> _Manager:
        m, states = _Manager(), _states(2, time.monotonic())
        gone = [False]

        async def is_disconnected() -> bool:
            return gone[0]

        async def consume() -> None:
            async for _ in _watch(m, states, is_disconnected):
                pass

        task = asyncio.create_task(consume())
        _output(states[0], finished=True)
        await asyncio.sleep(5 * POLL_S)
        assert not task.done()
        gone[0] = True
        with pytest.raises(ClientDisconnected):
            await asyncio.wait_for(task, 5)
        return m

    m = asyncio.run(main())
    assert m.aborted == [["r1"]]


def test_deadline_times_out_once_then_waits_for_the_last_output():
    async def main() -> tuple[_Manager, list[int]]:
        m, states = _Manager(), _states(1, time.monotonic())
        yields: list[int] = []

        async def is_disconnected() -> bool:
            return False

        async def consume() -> None:
            async for got in _watch(m, states, is_disconnected, timeout=3 * POLL_S):
                yields.append(got[0].updates)

        task = asyncio.create_task(consume())
        await asyncio.sleep(10 * POLL_S)
        assert m.timed_out == [f"request timed out after {3 * POLL_S:g} s"]  # once, not at every poll
        assert not task.done()
        _output(states[0], finished=True)  # the scheduler's aborted output
        await asyncio.wait_for(task, 5)
        return m, yields

    m, yields = asyncio.run(main())
    assert yields == [1]


def test_an_error_set_on_the_state_raises_503():
    async def main() -> None:
        m, states = _Manager(), _states(1, time.monotonic())

        async def is_disconnected() -> bool:
            return False

        async def consume() -> None:
            async for _ in _watch(m, states, is_disconnected):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(2 * POLL_S)
        states[0].error = "the scheduler process died"
        states[0].event.set()
        with pytest.raises(RequestError) as e:
            await asyncio.wait_for(task, 5)
        assert e.value.status_code == 503

    asyncio.run(main())


def test_an_output_that_came_before_the_watch_started_is_yielded():
    async def main() -> list[int]:
        m, states = _Manager(), _states(1, time.monotonic())
        _output(states[0], finished=True)  # already there (and already finished) when the watch starts

        async def is_disconnected() -> bool:
            return False

        async def collect() -> list[int]:
            return [s.updates async for s in _flatten(_watch(m, states, is_disconnected))]

        return await asyncio.wait_for(collect(), 5)  # it waited forever for an output already there

    assert asyncio.run(main()) == [1]


async def _flatten(gen):
    async for states in gen:
        for s in states:
            yield s


def test_outputs_that_arrive_while_the_consumer_holds_a_yield_are_not_lost():
    # A streamed request whose client reads slowly: its SSE write blocks while the consumer holds the
    # yield, the last outputs arrive meanwhile. The watch returned on seeing every rid finished, so the
    # stream sent [DONE] without its final event (no finish_reason, the text cut short).
    async def main() -> tuple[list[int], _Manager]:
        m, states = _Manager(), _states(2, time.monotonic())

        async def is_disconnected() -> bool:
            return False

        watch = _watch(m, states, is_disconnected)
        _output(states[0])
        got = [sum(s.updates for s in await asyncio.wait_for(watch.__anext__(), 5))]
        _output(states[0], finished=True)  # while the consumer is held (a blocked write)
        _output(states[1], finished=True)
        await asyncio.sleep(3 * POLL_S)
        got.append(sum(s.updates for s in await asyncio.wait_for(watch.__anext__(), 5)))
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(watch.__anext__(), 5)
        return got, m

    got, m = asyncio.run(main())
    assert got == [1, 3]
    assert m.aborted == [[]]


def test_the_deadline_aborts_while_the_consumer_holds_a_yield():
    async def main() -> _Manager:
        m, states = _Manager(), _states(1, time.monotonic())

        async def is_disconnected() -> bool:
            return False

        watch = _watch(m, states, is_disconnected, timeout=3 * POLL_S)
        _output(states[0])
        await asyncio.wait_for(watch.__anext__(), 5)
        await asyncio.sleep(10 * POLL_S)  # held past the deadline: the timer sends the abort itself
        assert m.timed_out == [f"request timed out after {3 * POLL_S:g} s"]
        _output(states[0], finished=True)
        await asyncio.wait_for(watch.__anext__(), 5)
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(watch.__anext__(), 5)
        return m

    m = asyncio.run(main())
    assert m.timed_out == [f"request timed out after {3 * POLL_S:g} s"]
