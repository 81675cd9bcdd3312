"""Turns a forward's logits and sampled tokens into request state: input/output logprobs,
appended tokens, stop checks (SGLang's ``scheduler_output_processor_mixin``, as a collaborator)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from radixlm.constrained import fill_batch_bitmask
from radixlm.kernels.sampling import SamplingBatchInfo, compute_logprobs
from radixlm.managers.io_struct import FinishReason
from radixlm.managers.kv_manager import KVManager
from radixlm.managers.schedule_batch import Req
from radixlm.managers.tp_worker import WorkerOutput
from radixlm.srt.forward_batch import ForwardMode, ModelWorkerBatch


class ResultProcessor:
    def __init__(self, kv: KVManager, tokenizer: Any, top_logprobs_cap: int = 20):
        self.kv = kv
        self.tokenizer = tokenizer
        self.top_logprobs_cap = top_logprobs_cap

    def decode_text(self, ids: list[int]) -> str:
        """Token ids -> text as the stop-string checks read it (special tokens kept)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def sampling_inputs(self, reqs: list[Req], mwb: ModelWorkerBatch, vocab_size: int
                        ) -> tuple[SamplingBatchInfo, Optional[torch.Tensor]]:
        """Sampling tensors for the batch's rows, plus the grammar bitmask if any row is constrained."""
        # A complete grammar may allow only EOS: min_new_tokens must not mask it then.
        stop_ids = [frozenset() if r.grammar is not None and r.grammar.is_completed() else r.stop_ids
                    for r in reqs]
        info = SamplingBatchInfo.from_requests(
            [r.sampling_params for r in reqs], [r.output_ids for r in reqs], vocab_size,
            stop_ids, device=self.kv.req_to_token_pool.req_to_token.device,
            prompt_ids=[r.origin_input_ids for r in reqs])
        mask = None
        if any(r.grammar is not None for r in reqs):
            samples = [r.num_cached + r.extend_len == r.seq_len for r in reqs]
            # Tokens left, this one included: a JSON grammar closes its output before the limit.
            left = [r.max_new_tokens - len(r.output_ids) for r in reqs]
            mask = fill_batch_bitmask([r.grammar if r.grammar is not None and s else None
                                       for r, s in zip(reqs, samples)], vocab_size, left)
        return info, mask

    def process(self, reqs: list[Req], mwb: ModelWorkerBatch, out: WorkerOutput) -> list[Req]:
        """Advance every request of the batch; returns those that finished."""
        offsets = out.logits_row_offsets
        if mwb.forward_mode is ForwardMode.EXTEND:
            self._input_logprobs(reqs, mwb, out)
        next_ids = out.next_token_ids.tolist() if out.next_token_ids is not None else []
        lp_rows = [i for i, r in enumerate(reqs) if r.return_logprob]
        out_lp: dict[int, tuple[float, Optional[list[tuple[float, int]]]]] = {}
        if lp_rows:
            rows = torch.tensor([offsets[i + 1] - 1 for i in lp_rows], dtype=torch.int64)
            ids = torch.tensor([next_ids[i] for i in lp_rows], dtype=torch.int64)
            k = min(max(reqs[i].top_logprobs_num for i in lp_rows), self.top_logprobs_cap)
            lps, top_v, top_i = compute_logprobs(out.logits.index_select(0, rows.to(out.logits.device)), ids.to(out.logits.device), k)
            for j, i in enumerate(lp_rows):
                top = None
                if reqs[i].top_logprobs_num:
                    n = min(reqs[i].top_logprobs_num, k)
                    top = list(zip(top_v[j, :n].tolist(), top_i[j, :n].tolist()))
                out_lp[i] = (float(lps[j]), top)
        finished = []
        for i, r in enumerate(reqs):
            first_completion = r.num_cached < r.seq_len and r.num_cached + r.extend_len == r.seq_len and not r.output_ids
            r.num_cached += r.extend_len
            if r.num_cached < r.seq_len:
                continue  # a prefill chunk: nothing to sample yet
            if first_completion and r.num_retractions == 0:
                r.input_logprobs_done = True
            if r.max_new_tokens == 0:
                r.finished_reason = FinishReason(type="length", length=0)
                finished.append(r)
                continue
            r.output_ids.append(next_ids[i])
            if i in out_lp:
                r.pending_output_logprobs.append(out_lp[i][0])
                if out_lp[i][1] is not None:
                    r.pending_output_top.append(out_lp[i][1])
            if r.grammar is not None and not r.grammar.accept_token(next_ids[i]):
                r.to_abort = FinishReason(type="abort", status_code=500,
                                          message=f"internal error: the grammar rejected sampled token {next_ids[i]}")
            r.check_finished(self.decode_text)
            if r.finished:
                finished.append(r)
        return finished

    def _input_logprobs(self, reqs: list[Req], mwb: ModelWorkerBatch, out: WorkerOutput) -> None:
        """Logprob of each prompt token from ``logprob_start_len`` on, from the previous row's logits."""
        rows: list[int] = []
        targets: list[int] = []
        owners: list[Req] = []
        for i, r in enumerate(reqs):
            rel = mwb.logprob_start_lens[i] if mwb.logprob_start_lens else None
            if rel is None or r.input_logprobs_done:
                continue
            if r.logprob_start_len == 0 and not r.input_token_logprobs:
                r.input_token_logprobs.append(None)
                r.input_top_logprobs.append(None)
            lo, hi = out.logits_row_offsets[i], out.logits_row_offsets[i + 1]
            first_pos = r.num_cached + rel
            for j in range(hi - lo):
                pos = first_pos + j
                if pos + 1 < len(r.origin_input_ids):
                    rows.append(lo + j)
                    targets.append(r.origin_input_ids[pos + 1])
                    owners.append(r)
        if not rows:
            return
        k = min(max(r.top_logprobs_num for r in owners), self.top_logprobs_cap)
        dev = out.logits.device
        lps, top_v, top_i = compute_logprobs(out.logits.index_select(0, torch.tensor(rows, device=dev)),
                                             torch.tensor(targets, device=dev), k)
        lps_list = lps.tolist()
        for j, r in enumerate(owners):
            r.input_token_logprobs.append(lps_list[j])
            top = None
            if r.top_logprobs_num:
                n = min(r.top_logprobs_num, k)
                top = list(zip(top_v[j, :n].tolist(), top_i[j, :n].tolist()))
            r.input_top_logprobs.append(top)
