"""TokenizerManager: the HTTP process's side of the pipeline (SGLang's ``tokenizer_manager.py``).

It tokenizes and validates each request, sends ``TokenizedGenerateReq`` to a scheduler replica through the
``DataParallelController`` (one replica unless ``--dp-size``; it routes, and matches control replies
first-in first-out per replica), and folds the detokenizer's ``BatchStrOut`` (PULL
``tokenizer_input``) into one ``ResponseAccumulator`` per rid.

Requests whose client goes away are aborted (``AbortReq``) at once; their state stays until the
scheduler's terminal output arrives, so ``len(self.states)`` counts every request the scheduler
still holds. That count, plus the sequences admitted and not yet sent, bounds admission: beyond
``max_running_requests + max_queued_requests`` outstanding requests a new one is refused with 503
(an approximation of the scheduler's queue that needs no round trip), before a stream's HTTP 200.

Prompts are tokenized by ``PromptTokenizer``: large ones on a worker thread, so the event loop keeps
serving. A request's time limit (its ``timeout``, capped by ``--request-timeout``; seconds from its
arrival) is enforced here: at the deadline its unfinished rids are aborted in the scheduler, and end
with finish_reason ``abort`` / ``request timed out after X s``, keeping their partial output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Callable, Optional, Union

import msgspec
import zmq

from radixlm.managers.data_parallel_controller import DataParallelController
from radixlm.managers.io_struct import (AbortReq, BatchStrOut, FlushCacheOut, FlushCacheReq, GetInternalStateReq,
                                        InternalState, Message, TokenizedGenerateReq, encode)
from radixlm.managers.ipc import AsyncPullReceiver, IpcPaths, receive_forever
from radixlm.managers.load_balance import CacheAware, CacheAwareConfig, create_load_balancer
from radixlm.managers.prompt_tokenizer import PromptTokenizer
from radixlm.managers.request_log import log_finished, log_received
from radixlm.managers.response import ResponseAccumulator
from radixlm.managers.validation import (InvalidRequestError, validate_generate_input, validate_logprob_start_len,
                                         validate_top_logprobs_num)
from radixlm.srt.errors import native_error_body
from radixlm.srt.sampling_params import SamplingParams, SamplingParamsError, sample_copies

logger = logging.getLogger(__name__)

_DISCONNECT_POLL_S = 0.5  # how often a waiting request checks whether its client is still there
_CONTROL_TIMEOUT_S = 30.0
# Most sequences (prompts x n) one HTTP request may start: bounds the work a single body can create.
MAX_SEQUENCES_PER_REQUEST = 1024


class RequestError(Exception):
    """A request that failed with an HTTP status (503 when overloaded or the scheduler is gone).
    ``param``: the native field at fault when known (e.g. ``"json_schema"``), else None."""

    def __init__(self, message: str, status_code: int = 400, param: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param


class ClientDisconnected(Exception):
    """The HTTP client went away; its requests have been aborted."""


@dataclasses.dataclass
class GenerateRequest:
    """A ``/generate`` body with its batch dimension made explicit (one entry per prompt).

    prompts: text (tokenized here) or token ids. sampling_params: raw dicts (None values mean
    default). rids: one per prompt, or None for fresh ids. is_batch: the client sent a list, so the
    answer is a list.
    """

    prompts: list[Union[str, list[int]]]
    sampling_params: list[dict[str, Any]]
    rids: Optional[list[str]]
    return_logprob: list[bool]
    logprob_start_len: list[int]
    top_logprobs_num: list[int]
    return_text_in_logprobs: bool = False
    stream: bool = False
    is_batch: bool = False
    timeout: Optional[float] = None  # seconds (> 0) this request may take; the server's --request-timeout caps it
    data_parallel_rank: Optional[int] = None  # the --dp-size replica to run on (None: the router picks)
    no_logs: bool = False  # keep it out of the --log-requests log


@dataclasses.dataclass
class PreparedRequest:
    """Validated, tokenized messages. ``warmups`` (for n > 1) prefill each prompt first so the n
    copies share its cached prefix; ``msgs`` are in output order (prompt-major, then sample)."""

    warmups: list[TokenizedGenerateReq]
    msgs: list[TokenizedGenerateReq]
    is_batch: bool
    return_text_in_logprobs: bool
    created: float  # time.monotonic() when the request arrived
    timeout: Optional[float] = None  # seconds from ``created`` until its unfinished rids are aborted
    data_parallel_rank: Optional[int] = None  # pins every message to this replica
    no_logs: bool = False
    # check_admission's hold on its sequences' queue places until they are registered (calling it
    # releases them; so does the request's garbage collection, for a stream that never started)
    admission: Optional[weakref.finalize] = dataclasses.field(default=None, repr=False, compare=False)


class ReqState:
    """What the TokenizerManager knows about one rid. ``event`` is shared by one HTTP request's rids."""

    def __init__(self, msg: TokenizedGenerateReq, acc: ResponseAccumulator, event: asyncio.Event, created: float):
        self.msg = msg
        self.acc = acc
        self.event = event
        self.created = created
        self.last_output: Optional[float] = None
        self.updates = 0
        self.error: Optional[str] = None
        self.timeout_message: Optional[str] = None  # set once its deadline passed and the abort was sent
        self.dp_rank = 0  # the data-parallel replica it was sent to
        self.logged = False  # its prompt went to the --log-requests log, so its result does too


class TokenizerManager:
    """Args: server_args (``ServerArgs``), tokenizer (transformers), vocab_size and context_len of the
    model, paths (``IpcPaths``), metrics (``ServerMetrics`` or None). Call ``start()`` inside the event
    loop before use and ``close()`` at shutdown."""

    def __init__(self, server_args: Any, tokenizer: Any, vocab_size: int, context_len: int, paths: IpcPaths,
                 metrics: Any = None):
        self.args = server_args
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_len = context_len
        self.paths = paths
        self.metrics = metrics
        self.prompt_tokenizer = PromptTokenizer(tokenizer, context_len)
        self.states: dict[str, ReqState] = {}
        self.dead: Optional[str] = None  # why the scheduler can no longer be reached
        self.draining = False  # SIGTERM received: open requests finish, new ones get 503 (graceful_shutdown)
        q = server_args.max_queued_requests
        self.max_outstanding = None if q is None else server_args.max_running_requests + q
        self.admitted = 0  # sequences check_admission let in that are not in ``states`` yet
        self._tasks: list[asyncio.Task] = []
        self._ctx = zmq.Context()
        dp_size = server_args.dp_size
        policy = create_load_balancer(server_args.load_balance_method, dp_size, _cache_aware_config(server_args))
        self.dp = DataParallelController(self._ctx, [paths.for_dp_rank(r, dp_size) for r in range(dp_size)], policy)
        self._from_detokenizer = AsyncPullReceiver(self._ctx, paths.tokenizer_input, bind=True)

    def start(self) -> None:
        self.dp.start()
        self._tasks = [asyncio.create_task(receive_forever(self._from_detokenizer, self._on_message,
                                                           "tokenizer manager"), name="tm-outputs")]
        policy = self.dp.policy
        if self.dp.size > 1 and isinstance(policy, CacheAware) and policy.config.max_tree_size is None:
            self._tasks.append(asyncio.create_task(self._bound_tree_by_pool(policy), name="tm-tree-size"))

    async def _bound_tree_by_pool(self, policy: CacheAware) -> None:
        """Default ``--router-max-tree-size``: the smallest replica's KV pool (what its radix tree can hold)."""
        try:
            states = await self.internal_states()
        except RequestError as e:
            logger.warning("cannot read the replicas' KV pool sizes (%s); the routing tree stays unbounded", e.message)
            return
        policy.set_max_tree_size(min(s.max_total_num_tokens for s in states))

    def close(self) -> None:
        """Stop the receive loops and close the sockets; later requests fail with 503."""
        self.fail_all(self.dead or "the server is shutting down")
        for task in self._tasks:
            task.cancel()
        self.dp.close()
        self._from_detokenizer.close()
        self._ctx.term()
        self.prompt_tokenizer.close()

    # ---- requests ------------------------------------------------------------------------------
    async def prepare(self, req: GenerateRequest) -> PreparedRequest:
        """Tokenize (large texts off the event loop: ``PromptTokenizer``) and validate every prompt.

        Raises:
            InvalidRequestError: bad input (message says what); nothing is sent then.
        """
        created = time.monotonic()
        if len(req.prompts) > MAX_SEQUENCES_PER_REQUEST:
            raise InvalidRequestError(f"a request may hold at most {MAX_SEQUENCES_PER_REQUEST} prompts, "
                                      f"got {len(req.prompts)}")
        texts = [p for p in req.prompts if isinstance(p, str)]
        encoded = iter(await self.prompt_tokenizer.encode(texts) if texts else [])
        return self._prepare_tokenized(req, [next(encoded) if isinstance(p, str) else list(p) for p in req.prompts],
                                       created)

    def _prepare_tokenized(self, req: GenerateRequest, prompt_ids: list[list[int]], created: float) -> PreparedRequest:
        """``prepare`` after tokenizing: one validated message per prompt (per sample for n > 1)."""
        base_rids = req.rids or [uuid.uuid4().hex for _ in req.prompts]
        dp_rank = req.data_parallel_rank
        if dp_rank is not None and not 0 <= dp_rank < self.dp.size:
            raise InvalidRequestError(f"data_parallel_rank must be in [0, {self.dp.size}) (--dp-size {self.dp.size}), "
                                      f"got {dp_rank}")
        items = []
        for i, ids in enumerate(prompt_ids):
            raw = req.sampling_params[i] or {}
            try:
                params = SamplingParams.from_dict(raw)
            except SamplingParamsError as e:
                raise InvalidRequestError(str(e), e.param) from None
            # An explicit max_new_tokens that cannot fit is an error; the default is clamped later.
            validate_generate_input(ids, params, self.vocab_size, self.context_len,
                                    strict_max_new_tokens=raw.get("max_new_tokens") is not None)
            validate_logprob_start_len(req.logprob_start_len[i], len(ids), req.return_logprob[i])
            validate_top_logprobs_num(req.top_logprobs_num[i])
            items.append((ids, params, i))
        ns = {params.n for _, params, _ in items}
        if len(ns) > 1:
            raise InvalidRequestError(f"all sampling_params of one request must share n, got {sorted(ns)}")
        n = ns.pop()
        if len(items) * n > MAX_SEQUENCES_PER_REQUEST:
            raise InvalidRequestError(f"a request may start at most {MAX_SEQUENCES_PER_REQUEST} sequences "
                                      f"(prompts x n), got {len(items)} x {n}")

        def msg(i: int, ids: list[int], params: SamplingParams, rid: str, stream: bool) -> TokenizedGenerateReq:
            return TokenizedGenerateReq(rid=rid, input_ids=ids, sampling_params=params, stream=stream,
                                        return_logprob=req.return_logprob[i],
                                        logprob_start_len=req.logprob_start_len[i],
                                        top_logprobs_num=req.top_logprobs_num[i])

        warmups, msgs = [], []
        for ids, params, i in items:
            if n == 1:
                msgs.append(msg(i, ids, params, base_rids[i], req.stream))
                continue
            prefill = msgspec.structs.replace(params, max_new_tokens=0, n=1)
            warmups.append(TokenizedGenerateReq(rid=f"{base_rids[i]}_prefill", input_ids=ids, sampling_params=prefill))
            copies = sample_copies(params, n)
            msgs.extend(msg(i, ids, p, f"{base_rids[i]}_{j}", req.stream) for j, p in enumerate(copies))
        seen: set[str] = set()
        for m in warmups + msgs:
            if m.rid in seen:
                raise InvalidRequestError(f"request id {m.rid!r} is given twice in this request")
            if m.rid in self.states:
                raise InvalidRequestError(f"request id {m.rid!r} is already in use")
            seen.add(m.rid)
            try:  # everything must cross the wire: fail here (400), before any state is registered
                encode(m)
            except (OverflowError, msgspec.EncodeError, ValueError, TypeError) as e:
                raise InvalidRequestError(f"a value of the request is out of range: {e}") from None
        return PreparedRequest(warmups, msgs, req.is_batch or n > 1, req.return_text_in_logprobs, created,
                               effective_timeout(req.timeout, self.args.request_timeout), dp_rank, req.no_logs)

    async def generate(self, prep: PreparedRequest, is_disconnected: Callable[[], Awaitable[bool]]
                       ) -> Union[dict, list[dict]]:
        """Run to completion; returns SGLang's response dict (a list for a batch).

        Raises:
            RequestError: overload (503), scheduler gone (503), or a request the scheduler
                rejected (its status, e.g. 400).
            ClientDisconnected: the client left (the requests were aborted).
        """
        states: list[ReqState] = []
        async for update in self._updates(prep, is_disconnected):
            states = update
        for s in states:
            fr = s.acc.finish_reason
            if fr is not None and fr.type == "abort" and fr.status_code is not None:
                raise RequestError(fr.message or "request aborted", fr.status_code, fr.param)
        results = [s.acc.result() for s in states]
        return results if prep.is_batch else results[0]

    async def generate_stream(self, prep: PreparedRequest, is_disconnected: Callable[[], Awaitable[bool]]
                              ) -> AsyncIterator[dict]:
        """Yield one cumulative response dict per update of each rid (with ``index`` for a batch);
        a rid the scheduler rejected yields ``{"error": {"message", "type", "code"}}`` instead of its last
        event. Raises as ``generate`` does (before or during the stream)."""
        seen: dict[str, int] = {}
        async for states in self._updates(prep, is_disconnected):
            for index, s in enumerate(states):
                if s.updates == seen.get(s.msg.rid, 0):
                    continue
                seen[s.msg.rid] = s.updates
                fr = s.acc.finish_reason
                if fr is not None and fr.type == "abort" and fr.status_code is not None:
                    yield native_error_body(fr.message or "request aborted", fr.status_code)
                    continue
                out = s.acc.result()
                if prep.is_batch:
                    out["index"] = index
                yield out

    async def _updates(self, prep: PreparedRequest, is_disconnected: Callable[[], Awaitable[bool]]
                       ) -> AsyncIterator[list[ReqState]]:
        """Submit, then yield the states after every change until all finish; aborts on exit."""
        if prep.admission is None:
            self.check_admission(prep)
        try:
            async for states in self._run(prep, is_disconnected):
                yield states
        finally:
            prep.admission()  # (idempotent) its sequences now count in ``states``, or it ended

    async def _run(self, prep: PreparedRequest, is_disconnected: Callable[[], Awaitable[bool]]
                   ) -> AsyncIterator[list[ReqState]]:
        if not prep.warmups:
            prep.admission()
            pins = [prep.data_parallel_rank] * len(prep.msgs)
            async for states in self._watch(self._submit(prep.msgs, prep, pins), is_disconnected, prep.timeout):
                yield states
            return
        warm = self._submit(prep.warmups, prep, [prep.data_parallel_rank] * len(prep.warmups))
        async for _ in self._watch(warm, is_disconnected, prep.timeout):
            pass
        n = len(prep.msgs) // len(prep.warmups)
        # A prompt whose warm-up was aborted (abort_request, a timeout, no room in the pool) ends its n
        # copies with the same reason, unsent: they were part of the request the abort named.
        ended = {i for i in range(len(prep.msgs)) if warm[i // n].acc.finish_reason.type == "abort"}
        live = [i for i in range(len(prep.msgs)) if i not in ended]
        prep.admission()
        sent = self._submit([prep.msgs[i] for i in live], prep, [warm[i // n].dp_rank for i in live])  # where the prefix is cached
        states: list[Optional[ReqState]] = [None] * len(prep.msgs)
        for i, s in zip(live, sent):
            states[i] = s
        event = sent[0].event if sent else asyncio.Event()
        for i in ended:
            w = warm[i // n]
            states[i] = ReqState(prep.msgs[i], ResponseAccumulator(prep.msgs[i].rid, prep.msgs[i].return_logprob,
                                                                   self.tokenizer, prep.return_text_in_logprobs),
                                 event, prep.created)
            states[i].acc.end_unsent(w.acc.finish_reason, len(prep.msgs[i].input_ids))
            states[i].updates = 1
        if not sent:
            yield states
            return
        async for _ in self._watch(sent, is_disconnected, prep.timeout):
            yield states

    async def _watch(self, states: list[ReqState], is_disconnected: Callable[[], Awaitable[bool]],
                     timeout: Optional[float] = None) -> AsyncIterator[list[ReqState]]:
        """Yield ``states`` after each change until all finished. ``timeout`` (seconds from the
        request's arrival): then the unfinished ones are aborted and end with finish_reason abort,
        ``request timed out after <timeout> s``, keeping their partial output.

        One timer per request fires every ``_DISCONNECT_POLL_S`` (and at the deadline, where it sends
        the abort itself, so a consumer held up in a slow socket write does not hold the abort up) and
        wakes the watch to ask whether the client is still there: a wait per streamed token is a bare
        ``Event.wait`` (``asyncio.wait_for`` made a task and a timer for each, the HTTP process's
        largest per-token cost after the socket write; on a 2-core box that CPU is the scheduler's).
        Outputs that arrive while the consumer holds a yield are yielded before the watch ends."""
        event = states[0].event
        deadline = None if timeout is None else states[0].created + timeout
        loop = asyncio.get_running_loop()
        due = False  # the timer fired since the last wake: check the client

        def on_timer() -> None:
            nonlocal deadline, due, timer
            if deadline is not None and time.monotonic() >= deadline:
                deadline = None  # aborted once; the scheduler's last output ends the request
                self._time_out(states, f"request timed out after {timeout:g} s")
            due = True
            event.set()
            timer = arm()

        def arm() -> asyncio.TimerHandle:
            wait_s = _DISCONNECT_POLL_S
            if deadline is not None:
                wait_s = min(wait_s, max(0.0, deadline - time.monotonic()))
            return loop.call_later(wait_s, on_timer)

        timer = arm()
        seen = 0  # updates yielded so far (any already there are yielded at the first wake)
        try:
            while True:
                await event.wait()
                event.clear()
                for s in states:
                    if s.error is not None:
                        raise RequestError(s.error, 503)
                if due:
                    due = False
                    if await is_disconnected():
                        raise ClientDisconnected() from None
                updates = sum(s.updates for s in states)
                if updates == seen:  # only the timer
                    continue
                seen = updates
                yield states
                if all(s.acc.finished for s in states) and sum(s.updates for s in states) == seen:
                    return  # (else the last outputs came during the yield: their event is set)
        finally:
            timer.cancel()
            self._abort_unfinished(states)

    def _time_out(self, states: list[ReqState], message: str) -> None:
        """Abort the unfinished rids of ``states`` in the scheduler (their KV is freed) with ``message``."""
        for s in states:
            if not s.acc.finished and s.error is None and self.dead is None and s.timeout_message is None:
                logger.info("request %s: %s; aborting it", s.msg.rid, message)
                s.timeout_message = message
                self.dp.abort(AbortReq(rid=s.msg.rid, exact=True, message=message))

    def _abort_unfinished(self, states: list[ReqState]) -> None:
        for s in states:
            if not s.acc.finished and s.error is None and self.dead is None:
                logger.info("aborting request %s (client gone or request cancelled)", s.msg.rid)
                self.dp.abort(AbortReq(rid=s.msg.rid, exact=True, message="client disconnected"))

    def check_admission(self, prep: PreparedRequest) -> None:
        """Admit ``prep``: its sequences hold places in the queue (``prep.admission``) until they are
        submitted, so a burst of streams, whose bodies start after their handlers return, cannot all
        pass the check before any of them is counted.

        Raises RequestError: 400 when the request alone is more sequences than the server may hold
        (running + queued: retrying cannot help), 503 when the scheduler is gone or the queue is full."""
        count = len(prep.msgs)  # a request's sequences; its warm-up prefills (n > 1) end in one step
        if self.dead is not None:
            raise RequestError(f"the server cannot serve requests: {self.dead}", 503)
        if self.draining:
            raise RequestError("the server is shutting down: it finishes its open requests and takes no new ones",
                               503)
        if self.max_outstanding is not None and count > self.max_outstanding:
            raise RequestError(f"the request is {count} sequences (prompts x n), more than this server holds at "
                               f"once ({self.max_outstanding}: --max-running-requests + --max-queued-requests)",
                               400)
        outstanding = len(self.states) + self.admitted
        if self.max_outstanding is not None and outstanding + count > self.max_outstanding:
            raise RequestError(f"The request queue is full ({outstanding} requests outstanding, "
                               f"--max-queued-requests {self.args.max_queued_requests}); retry later", 503)
        if prep.admission is not None:
            prep.admission()  # admitted again (a caller's second check): one hold at a time
        self.admitted += count
        prep.admission = weakref.finalize(prep, self._release_admission, count)

    def _release_admission(self, count: int) -> None:
        self.admitted -= count

    def _submit(self, msgs: list[TokenizedGenerateReq], prep: PreparedRequest, pins: list[Optional[int]]
                ) -> list[ReqState]:
        """Register and send ``msgs``; ``pins[i]``: the replica for ``msgs[i]`` (None: routed)."""
        event = asyncio.Event()
        states = []
        for m, pin in zip(msgs, pins):
            acc = ResponseAccumulator(m.rid, m.return_logprob, self.tokenizer, prep.return_text_in_logprobs)
            state = ReqState(m, acc, event, prep.created)
            self.states[m.rid] = state
            states.append(state)
            if self.args.log_requests and not prep.no_logs:  # user data: only when the operator asked
                state.logged = True
                log_received(m, self.tokenizer)
            state.dp_rank = self.dp.dispatch(m, pin)
        return states

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """Abort requests whose rid starts with ``rid`` (or all); each ends with finish_reason abort."""
        self.dp.abort(AbortReq(rid=rid, abort_all=abort_all))

    async def health_generate(self, timeout_s: float = 20.0) -> bool:
        """Run a one-token request on every replica; True if all finished within ``timeout_s``."""
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        base = f"HEALTH_CHECK_{uuid.uuid4().hex}"

        async def never() -> bool:
            return False

        def prep(replica: int) -> PreparedRequest:
            rid = base if self.dp.size == 1 else f"{base}_dp{replica}"
            msg = TokenizedGenerateReq(rid=rid, input_ids=[0], sampling_params=params)
            return PreparedRequest([], [msg], False, False, time.monotonic(), data_parallel_rank=replica)

        try:
            await asyncio.wait_for(asyncio.gather(*(self.generate(prep(r), never) for r in range(self.dp.size))),
                                   timeout_s)
        except (asyncio.TimeoutError, RequestError):
            return False
        return True

    # ---- control -------------------------------------------------------------------------------
    async def flush_cache(self, storage: bool = False) -> FlushCacheOut:
        """Flush the device and host tiers, or (``storage``) the storage tier's files, of every
        replica. Success only if every replica flushed; the message names the replicas that did not."""
        outs: list[FlushCacheOut] = await self._control(FlushCacheReq(storage=storage), FlushCacheOut)  # type: ignore[assignment]
        if not storage:
            for replica, out in enumerate(outs):
                if out.success:
                    self.dp.policy.on_flush(replica)
        if len(outs) == 1:
            return outs[0]
        failed = [f"replica {r}: {o.message}" for r, o in enumerate(outs) if not o.success]
        if failed:
            return FlushCacheOut(success=False, message="; ".join(failed))
        return FlushCacheOut(success=True, message="; ".join(f"replica {r}: {o.message}" for r, o in enumerate(outs)
                                                             if o.message))

    async def internal_states(self) -> list[InternalState]:
        """Every replica's scheduler counters, in replica order."""
        return await self._control(GetInternalStateReq(), InternalState)  # type: ignore[return-value]

    async def _control(self, msg: Message, reply_type: type) -> list[Message]:
        """Send a control message to every replica and await their replies (FIFO per replica).
        Raises RequestError(503) on timeout. Answered while draining too (metrics watch the drain)."""
        if self.dead is not None:
            raise RequestError(f"the server cannot serve requests: {self.dead}", 503)
        futures = self.dp.control(msg, reply_type)
        try:
            # shield: on timeout the futures stay queued, so late replies are still matched to them.
            return list(await asyncio.wait_for(asyncio.shield(asyncio.gather(*futures)), _CONTROL_TIMEOUT_S))
        except asyncio.TimeoutError:
            raise RequestError("the scheduler did not answer in time", 503) from None

    # ---- inbound -------------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        if isinstance(msg, BatchStrOut):
            self._on_output(msg)
        else:
            logger.warning("tokenizer manager: unexpected %s", type(msg).__name__)

    def _on_output(self, out: BatchStrOut) -> None:
        now = time.monotonic()
        t = out.token_out
        for i, rid in enumerate(t.rids):
            if t.finished_reasons[i] is not None:
                self.dp.on_finished(rid)
            state = self.states.get(rid)
            if state is None:
                continue
            state.acc.add(out, i, now - state.created)
            if state.timeout_message is not None:  # also when it was still queued ("Abort in waiting queue")
                state.acc.relabel_abort(state.timeout_message)
            state.updates += 1
            self._observe(state, len(t.output_ids[i]), now)
            if state.acc.finished:
                del self.states[rid]
                if state.logged:
                    log_finished(rid, state.acc.result())
            state.event.set()

    def _observe(self, state: ReqState, num_new: int, now: float) -> None:
        m = self.metrics
        if m is None:
            return
        m.observe_tokens(num_new)
        if num_new and state.msg.stream:
            if state.last_output is None:
                m.observe_first_token(now - state.created)
            else:
                m.observe_inter_token(now - state.last_output, num_new)
            state.last_output = now
        if state.acc.finished:
            meta = state.acc.meta
            fr = state.acc.finish_reason
            m.observe_finished(meta.get("prompt_tokens", 0), meta.get("cached_tokens", 0), now - state.created,
                               aborted=fr is not None and fr.type == "abort")

    def fail_all(self, reason: str) -> None:
        """A child process is gone or the server is shutting down: end every waiting request with
        ``reason`` (503) and refuse new ones."""
        self.dead = reason
        for state in self.states.values():
            state.error = reason
            state.event.set()
        self.states.clear()
        self.dp.fail_pending(RequestError(reason, 503))


def effective_timeout(requested: Optional[float], server: Optional[float]) -> Optional[float]:
    """The time limit of a request in seconds: the smaller of its own ``timeout`` and the server's
    ``--request-timeout`` where both are set; None for no limit."""
    limits = [t for t in (requested, server) if t is not None]
    return min(limits) if limits else None


def _cache_aware_config(args: Any) -> CacheAwareConfig:
    """The cache-aware policy's knobs from the ``--router-*`` flags."""
    return CacheAwareConfig(cache_threshold=args.router_cache_threshold,
                            balance_abs_threshold=args.router_balance_abs_threshold,
                            balance_rel_threshold=args.router_balance_rel_threshold,
                            max_tree_size=args.router_max_tree_size)
