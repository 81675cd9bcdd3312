"""The offline, in-process engine: ``radixlm.Engine(model_path=..., **server_args)``.

Same request and response shapes as SGLang's ``/generate`` (SGLang's
``GenerateReqInput``): ``generate(prompt | list | input_ids, sampling_params) -> dict | list[dict]`` with
``text``, ``output_ids`` and ``meta_info``. The scheduler and the detokenizer run in this process,
driven synchronously; no sockets.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from typing import Any, Iterator, Optional, Union

from radixlm.managers.detokenizer_manager import DetokenizerManager
from radixlm.managers.io_struct import BatchStrOut, BatchTokenOut, TokenizedGenerateReq
from radixlm.managers.response import ResponseAccumulator
from radixlm.managers.scheduler import Scheduler, create_scheduler_grammar_backend
from radixlm.managers.tp_worker import TpModelWorker
from radixlm.managers.validation import (InvalidRequestError, validate_generate_input, validate_logprob_start_len,
                                         validate_top_logprobs_num)
from radixlm.srt.model_config import ModelConfig
from radixlm.srt.model_loader import load_tokenizer
from radixlm.srt.sampling_params import SamplingParams, SamplingParamsError, sample_copies
from radixlm.srt.server_args import ServerArgs, ServerArgsError

Prompt = Union[str, list[str], None]
InputIds = Union[list[int], list[list[int]], None]


class Engine:
    """In-process generation engine.

    Args:
        model_path: HF folder, .gguf file or hub id (None: the demo model).
        **kwargs: any ``ServerArgs`` field (``page_size``, ``chunked_prefill_size``, ``max_total_tokens``, ...).

    Raises:
        ServerArgsError: unknown or invalid option.
        ModelLoadError: the model cannot be loaded.
    """

    def __init__(self, model_path: Optional[str] = None, **kwargs: Any):
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        args = self.server_args
        if args.dp_size > 1:  # replicas are processes; this engine drives one scheduler in the caller's thread
            raise ServerArgsError(f"dp_size={args.dp_size}: data-parallel replicas need the server "
                                  "(radixlm serve --dp-size N); the in-process Engine runs one replica")
        if args.tp_size > 1:  # ranks are processes too: the Engine would run one unsharded copy
            raise ServerArgsError(f"tp_size={args.tp_size}: tensor parallelism needs the server "
                                  "(radixlm serve --tp-size N); the in-process Engine runs one rank")
        self.model_config = ModelConfig.from_path(args.model_path, dtype=args.model_dtype(), context_length=args.context_length,
                                                  device=args.device, cache_dir=args.cache_dir)
        if args.cpu_threads is not None:  # only when asked: the process is the caller's
            import torch

            torch.set_num_threads(args.cpu_threads)
        self.tokenizer = load_tokenizer(self.model_config.model_path, args.tokenizer_path)
        self.worker = TpModelWorker(self.model_config, args)
        self._outbox: list[BatchTokenOut] = []
        grammar = create_scheduler_grammar_backend(args, self.tokenizer, self.model_config)
        self.scheduler = Scheduler(args, self.worker, self.tokenizer, self._outbox.append, grammar)
        self.detokenizer = DetokenizerManager(self.tokenizer)
        self._ids = itertools.count()
        # The scheduler runs in the calling thread: calls from several threads take turns (unserialized
        # they interleaved scheduler steps and corrupted the KV bookkeeping).
        self._lock = threading.RLock()  # held while the scheduler runs (a call, or one step of a stream)
        self._no_stream = threading.Condition(self._lock)  # notified when an open stream ends
        self._closed = False
        # An open stream owns the engine between its steps, whichever thread reads it: other threads'
        # calls wait for it to end (the thread that opened it may still ask for info; a call raises).
        self._stream_open = False
        self._stream_thread: Optional[int] = None  # the thread that opened it

    # ---- public API ------------------------------------------------------------------------
    def generate(self, prompt: Prompt = None, sampling_params: Union[dict, list[dict], None] = None,
                 input_ids: InputIds = None, return_logprob: bool = False, logprob_start_len: int = -1,
                 top_logprobs_num: int = 0, rid: Union[str, list[str], None] = None,
                 stream: bool = False, return_text_in_logprobs: bool = False
                 ) -> Union[dict, list[dict], Iterator[dict]]:
        """Generate for one prompt (returns a dict) or a batch (returns a list, in input order).

        ``n > 1`` in ``sampling_params`` samples each prompt ``n`` times (as ``/generate`` does): a list,
        prompt-major; with a ``sampling_seed``, copy ``j`` samples with ``sampling_seed + j``. Safe to call
        from several threads (the calls take turns; pass a list to batch prompts).

        ``stream=True`` (one prompt, n = 1; SGLang's ``Engine.generate(..., stream=True)``) returns an
        iterator of the same dicts as they grow, cumulative as a streamed ``/generate``'s events: one per
        step that added output, the last with ``meta_info["finish_reason"]``. Other calls wait while it
        is open (in the same thread, another call while it is open raises RuntimeError); closing it early
        (``break``, ``close()``) aborts the request and frees its KV.

        ``return_text_in_logprobs`` (with ``return_logprob``): each logprob entry is
        ``[logprob, token_id, token_text]`` as ``/generate`` gives it, else the text is None.

        Raises:
            InvalidRequestError: bad input (empty, too long, ids outside the vocabulary, bad
                sampling values, an explicit ``max_new_tokens`` beyond the context left after the
                prompt, as ``/generate``'s 400; rids repeated within the call; a batch or ``n > 1``
                with ``stream``); nothing is queued then. Also a regex / JSON schema / EBNF the grammar
                backend cannot compile, found once queued (the call's other prompts have run; a
                stream raises it in place of its last event).
            RuntimeError: after ``shutdown()``; a call from a thread whose stream is still open.
        An exception while the call runs (Ctrl-C, a timeout's) aborts the call's requests and frees
        their KV before it propagates.
        """
        with self._lock:
            self._refuse_inside_a_stream()
            self._wait_for_streams()
            msgs, batch, samples = self._prepare(prompt, sampling_params, input_ids, return_logprob,
                                                 logprob_start_len, top_logprobs_num, rid, stream)
            if not stream:
                results = self._run(msgs, return_text_in_logprobs)
                out = [results[m.rid] for m in msgs]
                for r in out:
                    _raise_if_refused(r)
                return out if batch or samples > 1 else out[0]
        if batch or samples > 1:
            raise InvalidRequestError("stream=True takes one prompt and n = 1 (pass a string or one list of ids)")
        return self._stream(msgs[0], return_text_in_logprobs)

    def _refuse_inside_a_stream(self) -> None:
        """Other threads wait for an open stream (the lock); this thread would run the scheduler under it
        and take its outputs, so it is an error."""
        if self._stream_thread == threading.get_ident():
            raise RuntimeError("a stream of this engine is still open in this thread: consume or close() it "
                               "before the next call (other threads wait for it)")

    def _wait_for_streams(self) -> None:
        """(Holding the lock) wait until no stream is open, unless this thread opened it."""
        self._no_stream.wait_for(lambda: not self._stream_open or self._stream_thread == threading.get_ident())

    def _stream(self, msg: TokenizedGenerateReq, text_in_logprobs: bool = False) -> Iterator[dict]:
        # The lock is held for each step only, not across a yield: the stream may be read, closed or
        # collected in another thread than the one that opened it (a lock held across the yields was
        # released there, which raised and left the lock held for good).
        with self._lock:
            self._refuse_inside_a_stream()
            self._wait_for_streams()
            if self._closed:
                raise RuntimeError("the engine is shut down: create a new radixlm.Engine")
            self._stream_open, self._stream_thread = True, threading.get_ident()
            steps = self._steps([msg], "the stream was closed", text_in_logprobs)
        try:
            seen = (0, 0)
            while True:
                with self._lock:
                    accs = next(steps, None)
                if accs is None:
                    return
                acc = accs[msg.rid]
                now = (len(acc.output_ids), len(acc.text))
                if acc.finished or now != seen:
                    seen = now
                    result = acc.result()
                    _raise_if_refused(result)
                    yield result
        finally:
            with self._lock:
                steps.close()  # an unfinished request is aborted and its KV freed
                self._stream_open, self._stream_thread = False, None
                self._no_stream.notify_all()

    def _prepare(self, prompt: Prompt, sampling_params: Union[dict, list[dict], None], input_ids: InputIds,
                 return_logprob: bool, logprob_start_len: int, top_logprobs_num: int,
                 rid: Union[str, list[str], None], stream: bool = False
                 ) -> tuple[list[TokenizedGenerateReq], bool, int]:
        """Validate a call and build its requests: ``(msgs, batch, samples per prompt)``."""
        if self._closed:
            raise RuntimeError("the engine is shut down: create a new radixlm.Engine")
        batch, prompts_ids = self._normalize(prompt, input_ids)
        n = len(prompts_ids)
        params_list = self._params(sampling_params, n)
        rids = self._rids(rid, n)
        validate_top_logprobs_num(top_logprobs_num)
        msgs = []
        raws = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
        for ids, params, raw in zip(prompts_ids, params_list, raws):
            # As /generate: an explicit max_new_tokens that cannot fit is an error; the default is clamped.
            validate_generate_input(ids, params, self.model_config.vocab_size, self.model_config.context_len,
                                    strict_max_new_tokens=(raw or {}).get("max_new_tokens") is not None)
            validate_logprob_start_len(logprob_start_len, len(ids), return_logprob)
        ns = {params.n for params in params_list}
        if len(ns) > 1:
            raise InvalidRequestError(f"all sampling_params of one call must share n, got {sorted(ns)}")
        samples = ns.pop()
        for ids, params, r in zip(prompts_ids, params_list, rids):
            copies = ([(params, r)] if samples == 1
                      else [(p, f"{r}_{j}") for j, p in enumerate(sample_copies(params, samples))])
            msgs.extend(TokenizedGenerateReq(rid=cr, input_ids=ids, sampling_params=cp, return_logprob=return_logprob,
                                             logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
                                             stream=stream)
                        for cp, cr in copies)
        if len({m.rid for m in msgs}) < len(msgs):
            raise InvalidRequestError("rids must be unique within one call (with n > 1 each gets _<j> appended)",
                                      "rid")
        return msgs, batch, samples

    def flush_cache(self) -> bool:
        """Empty the radix tree (and the hierarchical cache's host tier); False while requests run."""
        with self._lock:
            self._wait_for_streams()
            return self.scheduler.flush_cache().success

    def clear_hicache_storage(self) -> bool:
        """Delete the hierarchical cache's storage files; False without a storage backend."""
        with self._lock:
            self._wait_for_streams()
            return self.scheduler.flush_storage().success

    def get_server_info(self) -> dict:
        with self._lock:
            self._wait_for_streams()
            state = self.scheduler.internal_state()
        from radixlm.srt.cpu_runtime import cpu_info

        return {**self.server_args.to_dict(), "max_total_num_tokens": state.max_total_num_tokens,
                "model_dtype": str(self.model_config.dtype).removeprefix("torch."), "cpu": cpu_info().to_json(),
                "internal_state": {f: getattr(state, f) for f in state.__struct_fields__}}

    def shutdown(self) -> None:
        """Drop queued work, finish queued storage writes, stop the grammar compiler threads; later
        ``generate`` calls raise RuntimeError."""
        with self._lock:
            self._wait_for_streams()
            self._closed = True
            self.scheduler.waiting.clear()
            self.scheduler.close()
            if self.scheduler.grammar_cache is not None:
                self.scheduler.grammar_cache.shutdown()

    # ---- internals -------------------------------------------------------------------------
    def _run(self, msgs: list[TokenizedGenerateReq], text_in_logprobs: bool = False) -> dict[str, dict]:
        accs: dict[str, ResponseAccumulator] = {}
        for accs in self._steps(msgs, "the generate call was interrupted", text_in_logprobs):
            pass
        return {rid: a.result() for rid, a in accs.items()}

    def _steps(self, msgs: list[TokenizedGenerateReq], stop_message: str, text_in_logprobs: bool = False
               ) -> Iterator[dict[str, ResponseAccumulator]]:
        """Queue ``msgs`` and step the scheduler until they all finish, yielding their accumulators
        (by rid) after every step. An exception, or closing the iterator early (Ctrl-C, a timeout, a
        stream's consumer leaving), aborts the unfinished ones with ``stop_message`` and frees their KV."""
        accs = {m.rid: ResponseAccumulator(m.rid, m.return_logprob, self.tokenizer, text_in_logprobs) for m in msgs}
        start = time.monotonic()
        for m in msgs:
            self.scheduler.add_request(m)
        try:
            while not all(a.finished for a in accs.values()):
                progressed = self.scheduler.step()
                self._drain(accs, start)
                yield accs
                if not progressed and not all(a.finished for a in accs.values()):
                    raise RuntimeError("scheduler went idle with unfinished requests")
        except BaseException:
            for rid, a in accs.items():
                if not a.finished:
                    self.scheduler.abort(rid, exact=True, message=stop_message)
            self.scheduler.step()  # reaps the aborted running requests (nothing else is queued)
            self._outbox.clear()
            raise

    def _drain(self, acc: dict[str, ResponseAccumulator], start: float) -> None:
        while self._outbox:
            str_out: BatchStrOut = self.detokenizer.handle(self._outbox.pop(0))
            for i, rid in enumerate(str_out.token_out.rids):
                if rid in acc:
                    acc[rid].add(str_out, i, time.monotonic() - start)

    def _normalize(self, prompt: Prompt, input_ids: InputIds) -> tuple[bool, list[list[int]]]:
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("give exactly one of prompt and input_ids")
        if prompt is not None:
            if isinstance(prompt, str):
                return False, [self.tokenizer.encode(prompt)]
            if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt) or not prompt:
                raise InvalidRequestError("prompt must be a string or a non-empty list of strings")
            return True, [self.tokenizer.encode(p) for p in prompt]
        assert input_ids is not None
        if input_ids and all(isinstance(x, list) for x in input_ids):
            return True, [list(x) for x in input_ids]  # type: ignore[arg-type]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in input_ids):
            raise InvalidRequestError("input_ids must be a list of ints or a list of lists of ints")
        return False, [list(input_ids)]  # type: ignore[arg-type]

    def _params(self, sp: Union[dict, list[dict], None], n: int) -> list[SamplingParams]:
        try:
            if isinstance(sp, list):
                if len(sp) != n:
                    raise InvalidRequestError(f"got {len(sp)} sampling_params for {n} prompts")
                return [SamplingParams.from_dict(d) for d in sp]
            return [SamplingParams.from_dict(sp)] * n
        except SamplingParamsError as e:
            raise InvalidRequestError(str(e)) from None

    def _rids(self, rid: Union[str, list[str], None], n: int) -> list[str]:
        if rid is None:
            return [uuid.uuid4().hex for _ in range(n)]
        if isinstance(rid, str):
            return [rid] if n == 1 else [f"{rid}_{i}" for i in range(n)]
        if len(rid) != n:
            raise InvalidRequestError(f"got {len(rid)} rids for {n} prompts")
        return list(rid)


def _raise_if_refused(result: dict) -> None:
    """A request the scheduler refused as bad input (finish_reason abort with status 400: a regex or
    JSON schema the grammar backend cannot compile) raises, as ``/generate`` answers 400."""
    fr = result["meta_info"].get("finish_reason") or {}
    if fr.get("type") == "abort" and fr.get("status_code") == 400:
        raise InvalidRequestError(fr.get("message") or "the request was refused", fr.get("param"))
