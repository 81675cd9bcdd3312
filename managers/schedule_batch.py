"""``Req``: the scheduler's CPU-side state of one request (SGLang's ``schedule_batch.Req``).

Counters, not phase flags: ``num_cached`` tokens of ``fill_ids`` (= prompt + output) have KV in the
request's ``req_to_token`` row; the next extend computes ``fill_ids[num_cached:]`` (or a chunk of it);
decode is an extend of one token. Of the row, ``[0, cache_protected_len)`` are pages owned by the
radix tree (locked through ``last_node``); the rest are owned by the request.
"""

from __future__ import annotations

import re
import time
from typing import Any, Optional

from radixlm.managers.io_struct import FinishReason, TokenizedGenerateReq
from radixlm.srt.sampling_params import SamplingParams


# Output tokens decoded for stop-regex search (a regex has no fixed length; SGLang bounds it too).
STOP_REGEX_WINDOW_TOKENS = 64
# Tokens decoded before an output window so its first token reads as it does after them (its
# SentencePiece leading space, byte merges): the detokenizer's context and the stop check's (vLLM/SGLang ~5).
DETOKENIZE_CONTEXT_TOKENS = 5


class Req:
    def __init__(self, msg: TokenizedGenerateReq, stop_ids: frozenset[int], max_new_tokens: int):
        self.rid = msg.rid
        self.origin_input_ids: list[int] = list(msg.input_ids)
        self.sampling_params: SamplingParams = msg.sampling_params
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids  # EOS (unless ignore_eos) + stop_token_ids
        self.stop_strs = msg.sampling_params.stop_strs()
        self.stop_regexes = [re.compile(p) for p in msg.sampling_params.stop_regexes()]
        self.stream = msg.stream
        self.return_logprob = msg.return_logprob
        self.top_logprobs_num = msg.top_logprobs_num
        # Input logprobs are wanted from this prompt position on (None: not wanted).
        self.logprob_start_len: Optional[int] = None
        if msg.return_logprob and msg.logprob_start_len >= 0:
            self.logprob_start_len = min(msg.logprob_start_len, len(self.origin_input_ids) - 1)

        self.output_ids: list[int] = []
        self.req_pool_idx: Optional[int] = None
        self.num_cached = 0
        self.cache_protected_len = 0
        self.last_node: Any = None
        self.extend_len = 0  # tokens computed in the current extend step
        self.cached_tokens = 0  # prompt tokens served from the radix tree (reported)
        # With the hierarchical cache: tokens of the last prefix match per tier ({"device", "host"[,
        # "storage"]}), and the reported copy of it (set with cached_tokens).
        self.match_tiers: Optional[dict[str, int]] = None
        self.cached_tokens_details: Optional[dict[str, int]] = None
        self.num_retractions = 0
        self.finished_reason: Optional[FinishReason] = None
        # Said with finish_reason length when max_new_tokens was cut to what the KV pool can hold.
        self.length_message: Optional[str] = None
        self.to_abort: Optional[FinishReason] = None
        self.grammar: Any = None  # a constrained.GrammarMatcher once compiled
        self.grammar_future: Any = None  # concurrent.futures.Future of the compiled grammar
        self.grammar_deadline = 0.0
        self.created = time.monotonic()
        # Speculative decoding (``managers/speculative``): the drafter's per-request state, and the
        # reported counters (None while speculation is off on this server): verify steps, and the
        # tokens they produced (accepted drafts + one bonus token each).
        self.spec_state: Any = None
        self.spec_verify_ct: Optional[int] = None
        self.spec_accepted_tokens = 0

        # What has been sent downstream.
        self.num_sent = 0
        self.stop_strs_sent = False
        # Logprob accumulators (entries not yet sent).
        self.pending_output_logprobs: list[float] = []
        self.pending_output_top: list[list[tuple[float, int]]] = []
        self.input_logprobs_done = self.logprob_start_len is None
        self.input_token_logprobs: list[Optional[float]] = []
        self.input_top_logprobs: list[Optional[list[tuple[float, int]]]] = []
        self.input_logprobs_ready = False

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def match_limit(self) -> int:
        """How many leading tokens may come from the radix tree: never the last token (its logits
        are needed), and not past the first position whose input logprob is wanted."""
        limit = self.seq_len - 1
        if not self.input_logprobs_done and self.logprob_start_len is not None:
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return limit

    def reset_for_retract(self) -> None:
        """Drop all KV state; the request will re-prefill prompt + output so far."""
        self.req_pool_idx = None
        self.num_cached = 0
        self.cache_protected_len = 0
        self.last_node = None
        self.extend_len = 0
        self.num_retractions += 1

    def _output_tail_text(self, decode_text: Any, size: int) -> tuple[str, str]:
        """Text of the last ``size`` output tokens, and of the same tokens less the newest one, as
        they read in context: the tokens just before the window (prompt tokens while the window
        reaches the output's start) are decoded with it and their text removed, so a first output
        token keeps its SentencePiece leading space exactly as the detokenizer shows it."""
        k = DETOKENIZE_CONTEXT_TOKENS
        start = max(len(self.output_ids) - size, 0)
        window = self.output_ids[start:]
        ctx = self.output_ids[max(start - k, 0):start]
        if len(ctx) < k:  # the window reaches the output's start: the prompt's last ids lead it
            ctx = self.origin_input_ids[max(len(self.origin_input_ids) - (k - len(ctx)), 0):] + ctx
        base = decode_text(ctx) if ctx else ""

        def text(ids: list[int]) -> str:
            full = decode_text(ctx + ids)
            return full[len(base):] if full.startswith(base) else decode_text(ids)

        return text(window), text(window[:-1])

    def check_finished(self, decode_text: Any) -> None:
        """Set ``finished_reason`` after a new output token: abort, grammar end, stop token, stop
        string, then length (a stop on the last allowed token reports ``stop``, like vLLM). ``decode_text(ids) -> str`` decodes a token tail."""
        if self.finished_reason is not None:
            return
        if self.to_abort is not None:
            self.finished_reason = self.to_abort
            return
        n = len(self.output_ids)
        last = self.output_ids[-1] if n else None
        if self.grammar is not None and self.grammar.is_terminated():
            self.finished_reason = FinishReason(type="stop", matched=last)
            return
        if last is not None and n >= self.sampling_params.min_new_tokens:
            if last in self.stop_ids:
                self.finished_reason = FinishReason(type="stop", matched=last)
                return
            if self.stop_strs:
                longest = max(len(s) for s in self.stop_strs)
                # A character may take up to 4 byte-fallback tokens; 2 more for merges at the edge.
                size = 4 * longest + 2
                tail, before = self._output_tail_text(decode_text, size)
                for s in self.stop_strs:
                    # Only an occurrence ending in the newest token counts: an older one was
                    # generated while min_new_tokens still forced the output on.
                    if tail.find(s, max(0, len(before) - len(s) + 1)) >= 0:
                        self.finished_reason = FinishReason(type="stop", matched=s)
                        return
            if self.stop_regexes:
                tail = self._output_tail_text(decode_text, STOP_REGEX_WINDOW_TOKENS)[0]
                for rx in self.stop_regexes:
                    if rx.search(tail):
                        self.finished_reason = FinishReason(type="stop", matched=rx.pattern)
                        return
        if n >= self.max_new_tokens:
            self.finished_reason = FinishReason(type="length", length=n, message=self.length_message)
