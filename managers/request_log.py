"""Request logging for ``--log-requests`` (SGLang's flag): prompts, sampling parameters and outputs.

Prompts and outputs are user data, so the server never writes them to its log unless the operator
passes ``--log-requests``; then each request is logged at INFO on the ``radixlm.requests`` logger
when it is submitted (``Receive: rid=... prompt=... sampling_params=...``) and when it finishes
(``Finish: rid=... text=... meta_info=...``). Texts longer than ``MAX_LOGGED_CHARS`` are cut.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

logger = logging.getLogger("radixlm.requests")

MAX_LOGGED_CHARS = 2048  # per logged text (prompt or output), in characters


def _clip(text: str) -> str:
    if len(text) <= MAX_LOGGED_CHARS:
        return text
    return f"{text[:MAX_LOGGED_CHARS]}...({len(text) - MAX_LOGGED_CHARS} more chars)"


def log_received(msg: Any, tokenizer: Any) -> None:
    """Log a submitted ``TokenizedGenerateReq``: rid, its prompt (decoded from ``input_ids``; the ids
    themselves without a tokenizer) and its sampling parameters."""
    prompt = tokenizer.decode(msg.input_ids) if tokenizer is not None else str(msg.input_ids)
    params = msgspec.structs.asdict(msg.sampling_params)
    logger.info("Receive: rid=%s prompt=%r sampling_params=%s", msg.rid, _clip(prompt), params)


def log_finished(rid: str, result: dict) -> None:
    """Log a finished request's response dict (``text``, else ``output_ids``, and ``meta_info``)."""
    text = result.get("text")
    output = _clip(text) if isinstance(text, str) else result.get("output_ids")
    meta = {k: v for k, v in (result.get("meta_info") or {}).items()
            if k not in ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs")}
    logger.info("Finish: rid=%s text=%r meta_info=%s", rid, output, meta)
