"""Packs what is new in a set of requests into one ``BatchTokenOut`` (struct of arrays)."""

from __future__ import annotations

from typing import Optional

from radixlm.managers.io_struct import BatchTokenOut
from radixlm.managers.schedule_batch import DETOKENIZE_CONTEXT_TOKENS, Req


def build_batch_output(reqs: list[Req], stats: dict[str, int]) -> Optional[BatchTokenOut]:
    """Entries for requests with new tokens, pending input logprobs, or a new finish reason.

    Advances each request's sent counters, so every id, logprob and finish reason is sent once.
    Updates ``stats`` (prompt/generation/cached token counters) as tokens are first reported.
    """
    out = BatchTokenOut(rids=[], output_ids=[], cached_tokens_details=[], finished_reasons=[], prompt_tokens=[], completion_tokens=[],
                        cached_tokens=[], skip_special_tokens=[], spaces_between_special_tokens=[],
                        no_stop_trim=[], include_stop_str=[], stop_strs=[], input_tail_ids=[],
                        output_token_logprobs=[], output_top_logprobs=[],
                        input_token_logprobs=[], input_token_ids=[], input_top_logprobs=[], num_retractions=[])
    for r in reqs:
        new_ids = r.output_ids[r.num_sent:]
        send_input_lp = r.return_logprob and r.input_logprobs_done and r.logprob_start_len is not None \
            and not r.input_logprobs_ready
        if not new_ids and not r.finished and not send_input_lp:
            continue
        if r.num_sent == 0 and not r.stop_strs_sent:
            stats["prompt_tokens"] += len(r.origin_input_ids)
            stats["cached_tokens"] += r.cached_tokens
            for tier, n in (r.cached_tokens_details or {}).items():
                stats[f"cached_tokens_{tier}"] = stats.get(f"cached_tokens_{tier}", 0) + n
        stats["generation_tokens"] += len(new_ids)
        p = r.sampling_params
        out.rids.append(r.rid)
        out.output_ids.append(new_ids)
        out.finished_reasons.append(r.finished_reason)
        out.prompt_tokens.append(len(r.origin_input_ids))
        out.completion_tokens.append(len(r.output_ids))
        out.cached_tokens.append(r.cached_tokens)
        out.skip_special_tokens.append(p.skip_special_tokens)
        out.spaces_between_special_tokens.append(p.spaces_between_special_tokens)
        out.no_stop_trim.append(p.no_stop_trim)
        out.include_stop_str.append(p.include_stop_str_in_output)
        out.stop_strs.append(None if r.stop_strs_sent else r.stop_strs)
        out.input_tail_ids.append(None if r.stop_strs_sent else r.origin_input_ids[-DETOKENIZE_CONTEXT_TOKENS:])
        out.num_retractions.append(r.num_retractions)
        out.cached_tokens_details.append(r.cached_tokens_details)
        out.spec_verify_ct.append(r.spec_verify_ct)
        out.spec_accepted_tokens.append(r.spec_accepted_tokens)
        if r.return_logprob:
            out.output_token_logprobs.append(r.pending_output_logprobs)
            out.output_top_logprobs.append(r.pending_output_top if r.top_logprobs_num else None)
            r.pending_output_logprobs, r.pending_output_top = [], []
        else:
            out.output_token_logprobs.append(None)
            out.output_top_logprobs.append(None)
        if send_input_lp:
            start = r.logprob_start_len or 0
            out.input_token_logprobs.append(r.input_token_logprobs)
            out.input_token_ids.append(r.origin_input_ids[start:])
            out.input_top_logprobs.append(r.input_top_logprobs if r.top_logprobs_num else None)
            r.input_logprobs_ready = True
        else:
            out.input_token_logprobs.append(None)
            out.input_token_ids.append(None)
            out.input_top_logprobs.append(None)
        r.stop_strs_sent = True
        r.num_sent = len(r.output_ids)
    return out if out.rids else None
