"""The scheduler's seam for n-gram speculative decoding: turn a decode step into a verify step.

``build_verify_batch(running)`` drafts for each running request (``ngram.NgramDrafter``), filters
the drafts through the request's grammar, keeps only what the KV pool can hold, allocates
``1 + len(draft)`` slots per request and returns a ``TARGET_VERIFY`` batch: one extend over the
paged KV of the last token + draft per request (requests without a draft ride along as an extend
of one), with logits at every new position. ``process`` then draws a target token per position
(``verify``), emits each request's accepted drafts + bonus token one by one through the usual
grammar and stop checks (so EOS, stop strings and max_new_tokens cut the run exactly where
non-speculative decoding would stop), frees the KV slots of rejected and cut tokens at once, and
updates the per-request back-off.

Logprobs (``return_logprob``) are supported per emitted token, from the raw logits of its verify
row, as the decode path computes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from radixlm.constrained import allocate_bitmask
from radixlm.kernels.sampling import SamplingBatchInfo, compute_logprobs
from radixlm.managers.io_struct import FinishReason
from radixlm.managers.kv_manager import KVManager
from radixlm.managers.schedule_batch import Req
from radixlm.managers.speculative.ngram import NgramDrafter
from radixlm.managers.speculative.verify import accept_length, sample_targets
from radixlm.managers.tp_worker import WorkerOutput
from radixlm.srt.forward_batch import ForwardMode, ModelWorkerBatch
from radixlm.srt.server_args import ServerArgs


@dataclass
class _Draft:
    """One request's part of a verify batch: its draft, and with a grammar the bitmask rows of the
    matcher state at each of the ``len(tokens) + 1`` positions and whether the output is complete
    there (stop tokens allowed despite min_new_tokens, as the decode path does)."""

    tokens: list[int]
    mask: Optional[torch.Tensor] = None
    completed: Optional[list[bool]] = None


class NgramSpeculator:
    """Drafts, verify batches and acceptance for ``--speculative-algorithm NGRAM``.

    ``stats`` (monotonic, for ``InternalState`` and /metrics): ``verify_steps`` (request-steps with
    a draft), ``draft_tokens`` (drafted), ``accepted_drafts`` (drafted tokens accepted),
    ``verify_tokens`` (output tokens those steps emitted: accepted drafts + bonus tokens).
    """

    def __init__(self, args: ServerArgs, kv: KVManager, context_len: int, vocab_size: int):
        self.kv = kv
        self.context_len = context_len
        self.vocab_size = vocab_size
        self.drafter = NgramDrafter(kv.tree, args.speculative_num_draft_tokens,
                                    args.speculative_ngram_min_match_window_size,
                                    args.speculative_ngram_max_match_window_size)
        self.stats = {"verify_steps": 0, "draft_tokens": 0, "accepted_drafts": 0, "verify_tokens": 0}
        self._pending: Optional[tuple[ModelWorkerBatch, list[_Draft]]] = None

    @staticmethod
    def on_new_request(req: Req) -> None:
        """Mark a request as running under speculation (its meta_info reports the counters)."""
        req.spec_verify_ct = 0

    # ---- before the forward ------------------------------------------------------------------
    def build_verify_batch(self, reqs: list[Req]) -> Optional[ModelWorkerBatch]:
        """A TARGET_VERIFY batch over ``reqs`` (the running requests, each able to take one decode
        token), or None when no request has a draft (the caller runs a plain decode step). KV slots
        are allocated here; ``process`` must follow with this batch's output."""
        drafts = [self._draft(r) for r in reqs]
        if not any(d.tokens for d in drafts):
            return None
        self._fit_memory(reqs, drafts)
        if not any(d.tokens for d in drafts):
            return None
        input_ids: list[int] = []
        slots: list[int] = []
        for r, d in zip(reqs, drafts):
            r.extend_len = 1 + len(d.tokens)
            got = self.kv.alloc_tokens(r, r.extend_len)
            assert got is not None, "_fit_memory left room for every draft"
            slots.extend(got)
            input_ids.append(r.output_ids[-1])
            input_ids.extend(d.tokens)
        mwb = ModelWorkerBatch(ForwardMode.TARGET_VERIFY, input_ids, [r.req_pool_idx for r in reqs],
                               [r.num_cached for r in reqs], [r.extend_len for r in reqs], slots)
        self._pending = (mwb, drafts)
        return mwb

    def _draft(self, r: Req) -> _Draft:
        if r.spec_state is None:
            r.spec_state = self.drafter.new_state()
        # Room for the bonus token within max_new_tokens, and every position inside the context.
        limit = min(r.max_new_tokens - len(r.output_ids) - 1, self.context_len - r.seq_len)
        tokens = self.drafter.propose(r.spec_state, r.fill_ids, limit) if limit > 0 else []
        if r.grammar is None:
            return _Draft(tokens)
        return self._grammar_rows(r, tokens)

    def _grammar_rows(self, r: Req, tokens: list[int]) -> _Draft:
        """Keep the draft's prefix the grammar allows; record the mask at each position (the
        matcher is advanced through the draft and rolled back)."""
        g = r.grammar
        left = r.max_new_tokens - len(r.output_ids)
        mask = allocate_bitmask(len(tokens) + 1, self.vocab_size)
        completed: list[bool] = []
        taken = 0
        for j in range(len(tokens) + 1):
            completed.append(g.is_completed())
            g.fill_bitmask(mask, j, left - j)
            if j == len(tokens):
                break
            tok = tokens[j]
            allowed = 0 <= tok < self.vocab_size and (int(mask[j, tok // 32]) >> (tok % 32)) & 1
            if not allowed or not g.accept_token(tok):
                break
            taken += 1
        g.rollback(taken)
        return _Draft(tokens[:taken], mask[:taken + 1], completed[:taken + 1])

    def _fit_memory(self, reqs: list[Req], drafts: list[_Draft]) -> None:
        """Drop drafts (first come, first served) that the pool cannot hold next to one decode
        token per request."""
        kv, ps = self.kv, self.kv.page_size
        room = kv.available_tokens() - sum(kv.pages_needed(r, 1) for r in reqs) * ps
        for r, d in zip(reqs, drafts):
            if not d.tokens:
                continue
            extra = (kv.pages_needed(r, 1 + len(d.tokens)) - kv.pages_needed(r, 1)) * ps
            if extra <= room:
                room -= extra
                continue
            d.tokens = []
            if d.mask is not None:
                d.mask, d.completed = d.mask[:1], d.completed[:1]  # type: ignore[index]

    # ---- after the forward -------------------------------------------------------------------
    def process(self, reqs: list[Req], mwb: ModelWorkerBatch, out: WorkerOutput,
                decode_text: Callable[[list[int]], str], top_logprobs_cap: int) -> list[Req]:
        """Accept drafts, emit tokens, free rejected KV; returns the requests that finished."""
        assert self._pending is not None and self._pending[0] is mwb, "process the batch just built"
        drafts = self._pending[1]
        self._pending = None
        logits, offsets = out.logits, out.logits_row_offsets
        info, mask = self._sampling_rows(reqs, drafts, logits.device)
        lp_rows = [row for i, r in enumerate(reqs) if r.return_logprob for row in range(offsets[i], offsets[i + 1])]
        raw = logits.index_select(0, torch.tensor(lp_rows, device=logits.device)) if lp_rows else None
        # A copy: the forward's logits are inference tensors, and the processors work in place.
        targets = sample_targets(logits.clone(), info, mask).tolist()
        finished: list[Req] = []
        lp_picks: list[tuple[Req, int, int]] = []  # (request, row among lp_rows, token)
        lp_base = 0
        for i, (r, d) in enumerate(zip(reqs, drafts)):
            lo, hi = offsets[i], offsets[i + 1]
            accepted = accept_length(d.tokens, targets[lo:hi])
            emitted = d.tokens[:accepted] + [targets[lo + accepted]]
            start = r.num_cached
            n = 0
            for tok in emitted:
                r.output_ids.append(tok)
                if r.return_logprob:
                    lp_picks.append((r, lp_base + n, tok))
                n += 1
                if r.grammar is not None and not r.grammar.accept_token(tok):
                    r.to_abort = FinishReason(type="abort", status_code=500,
                                              message=f"internal error: the grammar rejected sampled token {tok}")
                r.check_finished(decode_text)
                if r.finished:
                    break
            if r.return_logprob:
                lp_base += hi - lo
            # KV exists for the input token and the accepted drafts; the newest token has none yet.
            r.num_cached = start + n
            self.kv.free_beyond_cached(r, start + r.extend_len)
            if d.tokens:
                self._record(r, len(d.tokens), accepted, n)
            if r.finished:
                finished.append(r)
        if lp_picks:
            self._logprobs(raw, lp_picks, top_logprobs_cap)  # type: ignore[arg-type]
        return finished

    def _sampling_rows(self, reqs: list[Req], drafts: list[_Draft], device: Any
                       ) -> tuple[SamplingBatchInfo, Optional[torch.Tensor]]:
        """Sampling state per verify row: row j of a request sees its output + draft[:j]."""
        params, outputs, stops, prompts = [], [], [], []
        for r, d in zip(reqs, drafts):
            for j in range(len(d.tokens) + 1):
                params.append(r.sampling_params)
                prompts.append(r.origin_input_ids)
                outputs.append(r.output_ids + d.tokens[:j] if j else r.output_ids)
                stops.append(frozenset() if d.completed is not None and d.completed[j] else r.stop_ids)
        info = SamplingBatchInfo.from_requests(params, outputs, self.vocab_size, stops, device=device,
                                               prompt_ids=prompts)
        if all(d.mask is None for d in drafts):
            return info, None
        mask = allocate_bitmask(len(params), self.vocab_size)
        row = 0
        for d in drafts:
            rows = len(d.tokens) + 1
            if d.mask is not None:
                mask[row:row + rows] = d.mask
            row += rows
        return info, mask

    def _record(self, r: Req, drafted: int, accepted: int, emitted: int) -> None:
        r.spec_verify_ct = (r.spec_verify_ct or 0) + 1
        r.spec_accepted_tokens += emitted
        r.spec_state.budget.record(drafted, accepted)
        s = self.stats
        s["verify_steps"] += 1
        s["draft_tokens"] += drafted
        s["accepted_drafts"] += accepted
        s["verify_tokens"] += emitted

    @staticmethod
    def _logprobs(raw: torch.Tensor, picks: list[tuple[Req, int, int]], cap: int) -> None:
        """Output logprobs of the emitted tokens from their rows' raw logits."""
        dev = raw.device
        k = min(max(r.top_logprobs_num for r, _, _ in picks), cap)
        lps, top_v, top_i = compute_logprobs(raw.index_select(0, torch.tensor([p[1] for p in picks], device=dev)),
                                             torch.tensor([p[2] for p in picks], device=dev), k)
        values = lps.tolist()
        for j, (r, _, _) in enumerate(picks):
            r.pending_output_logprobs.append(values[j])
            if r.top_logprobs_num:
                n = min(r.top_logprobs_num, k)
                r.pending_output_top.append(list(zip(top_v[j, :n].tolist(), top_i[j, :n].tolist())))  # type: ignore[index]
