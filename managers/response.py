"""Accumulates a request's ``BatchStrOut`` entries into SGLang's ``/generate`` response shape.

``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
"cached_tokens", "e2e_latency", [spec_verify_ct, spec_accept_length], [logprob fields]}}``; logprobs are ``[logprob, token_id, text|None]``
triples (text only with ``return_text_in_logprobs``).
"""

from __future__ import annotations

from typing import Any, Optional

from radixlm.managers.io_struct import BatchStrOut, FinishReason


class ResponseAccumulator:
    def __init__(self, rid: str, return_logprob: bool, tokenizer: Any, return_text_in_logprobs: bool = False):
        self.rid = rid
        self.return_logprob = return_logprob
        self.tokenizer = tokenizer
        self.with_text = return_text_in_logprobs
        self.text = ""
        self.output_ids: list[int] = []
        self.finish_reason: Optional[FinishReason] = None
        self.meta: dict[str, Any] = {"id": rid, "finish_reason": None}
        self.output_token_logprobs: list[list] = []
        self.output_top_logprobs: list[Optional[list]] = []
        self.input_token_logprobs: list[list] = []
        self.input_top_logprobs: list[Optional[list]] = []

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _tok_text(self, tid: int) -> Optional[str]:
        return self.tokenizer.decode([tid]) if self.with_text else None

    def _triples(self, pairs: list[tuple[float, int]]) -> list[list]:
        return [[lp, tid, self._tok_text(tid)] for lp, tid in pairs]

    def add(self, out: BatchStrOut, i: int, elapsed_s: float) -> None:
        """Fold entry ``i`` of a batch output into this request's state."""
        t = out.token_out
        self.text += out.output_strs[i]
        new_ids = t.output_ids[i]
        self.output_ids.extend(new_ids)
        self.meta.update(prompt_tokens=t.prompt_tokens[i], completion_tokens=t.completion_tokens[i],
                         cached_tokens=t.cached_tokens[i], total_retractions=t.num_retractions[i])
        if t.cached_tokens_details and t.cached_tokens_details[i] is not None:
            self.meta["cached_tokens_details"] = t.cached_tokens_details[i]
        verify_ct = t.spec_verify_ct[i] if i < len(t.spec_verify_ct) else None
        if verify_ct is not None:  # speculative decoding is on: SGLang's two fields
            self.meta["spec_verify_ct"] = verify_ct
            self.meta["spec_accept_length"] = t.spec_accepted_tokens[i] / verify_ct if verify_ct else 1.0
        if self.return_logprob:
            lps = t.output_token_logprobs[i] or []
            self.output_token_logprobs.extend(self._triples(list(zip(lps, new_ids))))
            for top in t.output_top_logprobs[i] or []:
                self.output_top_logprobs.append(self._triples(top))
            if t.input_token_logprobs[i] is not None:
                ids = t.input_token_ids[i] or []
                self.input_token_logprobs = [[lp, tid, self._tok_text(tid)]
                                             for lp, tid in zip(t.input_token_logprobs[i], ids)]
                tops = t.input_top_logprobs[i]
                if tops is not None:
                    self.input_top_logprobs = [None if tp is None else self._triples(tp) for tp in tops]
        if t.finished_reasons[i] is not None:
            self.finish_reason = t.finished_reasons[i]
            self.meta["finish_reason"] = self.finish_reason.to_json()
            self.meta["e2e_latency"] = elapsed_s

    def end_unsent(self, reason: FinishReason, prompt_tokens: int) -> None:
        """End a request that was never sent to a scheduler (an n > 1 copy whose warm-up prefill was
        aborted) with ``reason``, no output and no cached tokens."""
        self.meta.update(prompt_tokens=prompt_tokens, completion_tokens=0, cached_tokens=0, total_retractions=0,
                         finish_reason=reason.to_json(), e2e_latency=0.0)
        self.finish_reason = reason

    def relabel_abort(self, message: str) -> None:
        """If the request ended with an abort that carries no HTTP status, report ``message`` as its
        reason (the TokenizerManager's own abort, e.g. a timeout, whatever queue the request was in)."""
        fr = self.finish_reason
        if fr is not None and fr.type == "abort" and fr.status_code is None:
            self.finish_reason = FinishReason(type="abort", message=message)
            self.meta["finish_reason"] = self.finish_reason.to_json()

    def result(self) -> dict:
        """The response so far; its lists are copies (a streamed engine's earlier events keep their length)."""
        meta = dict(self.meta)
        if self.return_logprob:
            meta["output_token_logprobs"] = list(self.output_token_logprobs)
            meta["input_token_logprobs"] = list(self.input_token_logprobs)
            if self.output_top_logprobs:
                meta["output_top_logprobs"] = list(self.output_top_logprobs)
            if self.input_top_logprobs:
                meta["input_top_logprobs"] = list(self.input_top_logprobs)
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}
