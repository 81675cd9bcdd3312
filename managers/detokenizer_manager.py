"""Incremental detokenization: ``BatchTokenOut`` (new ids per request) -> ``BatchStrOut`` (new text).

Per request, ``IncrementalDetokenizer`` runs vLLM/SGLang's two-offset scheme: it decodes
``ids[surr:read]`` and ``ids[surr:]`` and takes the difference as the new text, committing it only
when it does not end in U+FFFD (a multi-byte character split over byte tokens is held back until its
last byte arrives) and, for SentencePiece byte-fallback vocabularies, only once a non-byte token
closes the current run of ``<0xNN>`` tokens (see ``TokenizerTraits``). On top of that it holds back
any tail of the text that could still grow into a stop string, so a stop string is never streamed
and later retracted, and it trims the matched stop string / stop token at finish (unless
``no_stop_trim``). Units: offsets index token ids; ``sent_offset`` indexes characters.

``DetokenizerManager`` keeps those states by rid (pure logic, no sockets; the in-process Engine
calls it directly). ``run_detokenizer_process`` wraps it in a process between two ZMQ sockets.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import re
import signal
import sys
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional

from radixlm.managers.io_struct import BatchStrOut, BatchTokenOut, FinishReason
from radixlm.managers.startup_error import report_startup_failure

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from radixlm.managers.ipc import IpcPaths

logger = logging.getLogger(__name__)

# SGLang's SGLANG_DETOKENIZER_MAX_STATES default.
DEFAULT_MAX_STATES = 65536
_REPLACEMENT_CHAR = "\ufffd"
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
# How often (ms) the process loop wakes to check for SIGTERM / a dead parent when idle.
_POLL_MS = 200


def accepts_spaces_between_special_tokens(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode`` honours ``spaces_between_special_tokens``.

    In transformers 5 the fast (``TokenizersBackend``) and generic Python tokenizers swallow the
    kwarg in ``**kwargs`` and ignore it; only tokenizers whose ``_decode`` names it (the
    SentencePiece backend, which also ignores it in 5.x; wav2vec2; 4.x slow tokenizers) take it.
    We pass it only to those, so duck-typed tokenizers with a strict ``decode`` still work.
    """
    fn = getattr(tokenizer, "_decode", None) or getattr(tokenizer, "decode", None)
    try:
        params = inspect.signature(fn).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return "spaces_between_special_tokens" in params


@dataclasses.dataclass(frozen=True)
class TokenizerTraits:
    """What incremental decoding needs to know about a tokenizer (computed once per tokenizer).

    spaces_kwarg: see ``accepts_spaces_between_special_tokens``.
    byte_ids: SentencePiece byte-fallback tokens (``<0xNN>``). Their decoder turns a whole run of
        consecutive byte tokens into U+FFFDs when the run is not valid UTF-8, so text ending in such
        a run may still change with the next byte token; it is committed only once a non-byte token
        closes the run (or at finish).
    special_ids: added tokens marked special (dropped before decoding when skip_special_tokens, so
        they do not close a byte run).
    """

    spaces_kwarg: bool = False
    byte_ids: frozenset[int] = frozenset()
    special_ids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, tokenizer: Any) -> "TokenizerTraits":
        """Inspect a transformers tokenizer (or a duck-typed one without ``get_vocab``)."""
        get_vocab = getattr(tokenizer, "get_vocab", None)
        vocab = get_vocab() if callable(get_vocab) else {}
        byte_ids = frozenset(i for tok, i in vocab.items() if _BYTE_TOKEN.match(tok))
        special = set(getattr(tokenizer, "all_special_ids", None) or ())
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        special.update(i for i, tok in added.items() if getattr(tok, "special", False))
        return cls(accepts_spaces_between_special_tokens(tokenizer), byte_ids, frozenset(special))


class IncrementalDetokenizer:
    """Streaming text of one request.

    Args:
        tokenizer: anything with ``decode(ids: list[int], skip_special_tokens=bool, ...) -> str``.
        stop_strs: stop strings of the request (empty strings are ignored).
        skip_special_tokens, spaces_between_special_tokens: passed to ``decode`` (see
            ``accepts_spaces_between_special_tokens`` for when the latter has any effect).
        no_stop_trim: keep the matched stop string / stop token text in the output.
        include_stop_str: vLLM's include_stop_str_in_output: the text ends right after the matched
            stop string (no_stop_trim keeps the rest of its last token too); a stop token's text is kept.
        traits: precomputed ``TokenizerTraits.of(tokenizer)`` (computed here when None).

    Invariants: the concatenation of everything ``step`` returns equals the final text, which is
    ``tokenizer.decode(output_ids)`` (minus a trimmed stop token) cut at the matched stop string,
    invalid UTF-8 included; no increment ends inside a multi-byte character, and none contains
    U+FFFD unless the final text has it there.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        stop_strs: Optional[Sequence[str]] = None,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        no_stop_trim: bool = False,
        include_stop_str: bool = False,
        traits: Optional[TokenizerTraits] = None,
        context_ids: Sequence[int] = (),
    ) -> None:
        self._traits = traits if traits is not None else TokenizerTraits.of(tokenizer)
        self._skip_special = skip_special_tokens
        kwargs: dict[str, bool] = {"skip_special_tokens": skip_special_tokens}
        if self._traits.spaces_kwarg:
            kwargs["spaces_between_special_tokens"] = spaces_between_special_tokens
        self._decode: Callable[[list[int]], str] = lambda ids: tokenizer.decode(ids, **kwargs)
        # A context ending inside a byte-fallback run (a prompt cut mid-character) would shift the
        # text offsets; start after the run instead.
        context_ids = list(context_ids)
        while context_ids and context_ids[-1] in self._traits.byte_ids:
            context_ids.pop()
        self.stop_strs: tuple[str, ...] = tuple(s for s in (stop_strs or ()) if s)
        self.no_stop_trim = no_stop_trim
        self.include_stop_str = include_stop_str and not no_stop_trim
        # ``context_ids`` (the prompt's last ids) lead ``output_ids`` so the first output token is
        # decoded as it reads after the prompt (its SentencePiece leading space, byte merges);
        # their own text is never returned.
        self.num_context = len(context_ids)
        self.output_ids: list[int] = list(context_ids)
        # Text of output_ids[:read_offset]; output_ids[surr_offset:read_offset] is the context that
        # gives the next tokens their leading space / byte merges.
        self.surr_offset = 0
        self.read_offset = self.num_context
        self.decoded_text = ""
        self.sent_offset = 0  # characters of decoded_text already returned
        self.finished = False

    @property
    def text(self) -> str:
        """All text returned so far (the final text once ``finished``)."""
        return self.decoded_text[: self.sent_offset]

    def step(self, new_ids: Sequence[int], finish: Optional[FinishReason] = None) -> str:
        """Add the ids new since the last call; return the text new since the last call.

        ``finish`` (the request's finish reason, given with its last ids) flushes everything held
        back, trimming the stop string / stop token as described in the class docstring.

        Raises:
            RuntimeError: called again after a finishing call.
        """
        if self.finished:
            raise RuntimeError("IncrementalDetokenizer.step called after the request finished")
        self.output_ids.extend(new_ids)
        if finish is not None:
            return self._finish(finish)
        self._advance(len(self.output_ids))
        end = self._hold_back_start()
        out = self.decoded_text[self.sent_offset : end]
        self.sent_offset = end
        return out

    def _new_text(self, end: int) -> str:
        """Text of ``output_ids[read_offset:end]``, decoded with the surrounding context."""
        prefix = self._decode(self.output_ids[self.surr_offset : self.read_offset])
        full = self._decode(self.output_ids[self.surr_offset : end])
        return full[len(prefix) :]

    def _advance(self, end: int) -> None:
        """Commit ``output_ids[read_offset:end]`` unless its text is empty or may still change."""
        if end <= self.read_offset or self._in_byte_run(end):
            return
        new_text = self._new_text(end)
        if new_text and not new_text.endswith(_REPLACEMENT_CHAR):
            self.decoded_text += new_text
            self.surr_offset, self.read_offset = self.read_offset, end

    def _in_byte_run(self, end: int) -> bool:
        """Whether ``output_ids[:end]`` ends in an open run of byte-fallback tokens."""
        byte_ids = self._traits.byte_ids
        if not byte_ids:
            return False
        skipped = self._traits.special_ids if self._skip_special else frozenset()
        for i in range(end - 1, -1, -1):
            tok = self.output_ids[i]
            if tok not in skipped:
                return tok in byte_ids
        return False

    def _hold_back_start(self) -> int:
        """Index in ``decoded_text`` where the unsendable tail (a possible stop-string start) begins."""
        text, start = self.decoded_text, len(self.decoded_text)
        if self.no_stop_trim:
            return start  # nothing will be trimmed, so nothing needs holding back
        for stop in self.stop_strs:
            # Longest suffix of the unsent text that is a prefix of `stop` (a whole `stop` at the
            # very end included: the scheduler may not have reported that match yet).
            for k in range(min(len(stop), len(text) - self.sent_offset), 0, -1):
                if text.endswith(stop[:k]):
                    start = min(start, len(text) - k)
                    break
        return start

    def _finish(self, finish: FinishReason) -> str:
        self.finished = True
        end = len(self.output_ids)
        matched = finish.matched
        if (
            finish.type == "stop"
            and isinstance(matched, int)
            and not self.no_stop_trim
            and not self.include_stop_str
            and end > self.num_context
            and self.output_ids[-1] == matched
        ):
            end -= 1  # the stop token's text is not part of the output
        if end > self.read_offset:
            self.decoded_text += self._new_text(end)
            self.surr_offset, self.read_offset = self.read_offset, end
        elif end < self.read_offset:
            logger.warning("stop token %s was already streamed before its finish reason", matched)
        tail = self.decoded_text[self.sent_offset :]
        if finish.type == "stop" and isinstance(matched, str) and matched and not self.no_stop_trim:
            # The scheduler stops on an occurrence ending in the newest token, so the last
            # occurrence is the one that stopped generation (earlier ones were forced by
            # min_new_tokens).
            cut = tail.rfind(matched)
            if cut >= 0:
                tail = tail[:cut + len(matched)] if self.include_stop_str else tail[:cut]
        self.decoded_text = self.decoded_text[: self.sent_offset] + tail
        self.sent_offset = len(self.decoded_text)
        return tail


class DetokenizerManager:
    """Turns each ``BatchTokenOut`` into a ``BatchStrOut`` with per-request incremental text.

    A request's state is created by its first entry (which carries its ``stop_strs`` and flags) and
    dropped with its finished entry. At most ``max_states`` live at once; beyond that the least
    recently updated one is evicted with a warning, and that request's later text restarts from
    its next ids (wrong, but the request still finishes) — SGLang's "Decode status not found".
    """

    def __init__(self, tokenizer: Any, max_states: int = DEFAULT_MAX_STATES) -> None:
        if max_states < 1:
            raise ValueError(f"max_states must be >= 1, got {max_states}")
        self.tokenizer = tokenizer
        self.max_states = max_states
        self._traits = TokenizerTraits.of(tokenizer)
        self._states: OrderedDict[str, IncrementalDetokenizer] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()  # bounded, for the warning only

    def __len__(self) -> int:
        """Number of live (unfinished) request states."""
        return len(self._states)

    def __contains__(self, rid: object) -> bool:
        return rid in self._states

    def handle(self, batch: BatchTokenOut) -> BatchStrOut:
        """Detokenize one batch; ``output_strs[i]`` is the new text of ``batch.rids[i]``."""
        output_strs = []
        for i, rid in enumerate(batch.rids):
            state = self._states.get(rid)
            if state is None:
                state = self._create(batch, i)
            else:
                self._states.move_to_end(rid)
            finish = batch.finished_reasons[i]
            output_strs.append(state.step(batch.output_ids[i], finish))
            if finish is not None:
                del self._states[rid]
        return BatchStrOut(token_out=batch, output_strs=output_strs)

    def _create(self, batch: BatchTokenOut, i: int) -> IncrementalDetokenizer:
        rid = batch.rids[i]
        if rid in self._evicted:
            del self._evicted[rid]
            logger.warning("detokenizer state of request %r was evicted; its text is incomplete", rid)
        state = IncrementalDetokenizer(
            self.tokenizer,
            stop_strs=batch.stop_strs[i],
            skip_special_tokens=batch.skip_special_tokens[i],
            spaces_between_special_tokens=batch.spaces_between_special_tokens[i],
            no_stop_trim=batch.no_stop_trim[i],
            include_stop_str=batch.include_stop_str[i],
            traits=self._traits,
            context_ids=batch.input_tail_ids[i] or (),
        )
        self._states[rid] = state
        if len(self._states) > self.max_states:
            old_rid, _ = self._states.popitem(last=False)
            self._evicted[old_rid] = None
            if len(self._evicted) > self.max_states:
                self._evicted.popitem(last=False)
            logger.warning(
                "detokenizer holds more than %d unfinished requests; evicted the state of %r "
                "(its streamed text will be wrong)",
                self.max_states,
                old_rid,
            )
        return state


def _load_tokenizer(path: str) -> Any:
    try:
        from radixlm.srt.model_loader import load_tokenizer
    except ImportError:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    return load_tokenizer(path)


def run_detokenizer_process(
    tokenizer_path: str, paths: "IpcPaths", ready_pipe: Optional["Connection"]
) -> None:
    """Process entry: PULL ``BatchTokenOut`` on ``paths.detokenizer_input`` (bound here), PUSH
    ``BatchStrOut`` to ``paths.tokenizer_input`` (connected).

    Args:
        tokenizer_path: a resolved model folder (or tokenizer folder).
        paths: an ``ipc.IpcPaths``.
        ready_pipe: a ``multiprocessing`` Connection (or None). It receives exactly the str
            ``"ready"`` once the sockets are up; ``"error: <one-line reason>"`` if setting up fails
            (``startup_error``), ``"error: <traceback>"`` if it crashes after ready.

    Exits with status 0 on SIGTERM (SIGINT, the terminal's Ctrl-C, is the launcher's) or when its parent
    dies, 1 on any error (logged).
    """
    import zmq

    from radixlm.managers.ipc import PullReceiver, PushSender
    from radixlm.srt.process_title import set_process_title

    set_process_title("detokenizer")
    stopping: list[int] = []
    # Ctrl-C reaches the whole process group; the launcher handles it (it drains open requests, then
    # stops us with SIGTERM).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    parent_pid = os.getppid()
    ctx = zmq.Context()
    sockets: list[Any] = []
    try:
        receiver = PullReceiver(ctx, paths.detokenizer_input, bind=True)
        sockets.append(receiver)
        sender = PushSender(ctx, paths.tokenizer_input, bind=False)
        sockets.append(sender)
        manager = DetokenizerManager(_load_tokenizer(tokenizer_path))
    except Exception as exc:
        report_startup_failure(logger, "detokenizer", exc, ready_pipe)
        _close(sockets, ctx)
        logging.shutdown()
        os._exit(1)
    try:
        if ready_pipe is not None:
            ready_pipe.send("ready")
        _serve(manager, receiver, sender, stopping, parent_pid)
    except Exception:
        tb = traceback.format_exc()
        logger.error("detokenizer process crashed:\n%s", tb)
        if ready_pipe is not None:
            try:
                ready_pipe.send(f"error: {tb}")
            except OSError:
                pass  # parent already gone; the log has the error
        _close(sockets, ctx)
        logging.shutdown()
        os._exit(1)
    _close(sockets, ctx)
    # Skip interpreter teardown (torch's is slow): shutdown then takes ~0.1 s instead of ~0.8 s.
    logging.shutdown()
    os._exit(0)


def _serve(manager: DetokenizerManager, receiver: Any, sender: Any, stopping: list[int],
           parent_pid: int) -> None:
    """Detokenize until a signal lands in ``stopping`` or the parent process is gone."""
    while not stopping:
        msg = receiver.recv(timeout_ms=_POLL_MS)
        if msg is None:
            if os.getppid() != parent_pid:
                logger.warning("detokenizer: parent process %d exited; stopping", parent_pid)
                return
            continue
        if isinstance(msg, BatchTokenOut):
            sender.send(manager.handle(msg))
        else:
            logger.warning("detokenizer: ignoring unexpected %s", type(msg).__name__)


def _close(sockets: list[Any], ctx: Any) -> None:
    for sock in sockets:
        sock.close()
    ctx.term()
