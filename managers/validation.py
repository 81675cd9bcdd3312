"""Validation of a tokenized generate request, shared by the Engine, the TokenizerManager (which
reject early with HTTP 400) and the Scheduler (which aborts defensively with status 400)."""

from __future__ import annotations

from typing import Optional

from radixlm.srt.sampling_params import SamplingParams, SamplingParamsError


# Alternatives returned per position at most (vLLM's default --max-logprobs; OpenAI's top_logprobs
# cap). More is refused with a 400 rather than silently cut.
MAX_TOP_LOGPROBS = 20


class InvalidRequestError(ValueError):
    """A request that can never run (maps to HTTP 400). The message says what and why.

    ``param``: the native field at fault (``"stop"``, ``"logprob_start_len"``, ...) or None; the
    OpenAI routes report it, renamed to their own field, as the error's ``param``.
    """

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


def validate_top_logprobs_num(n: int) -> None:
    """Raise ``InvalidRequestError`` unless ``0 <= n <= MAX_TOP_LOGPROBS``."""
    if n < 0:
        raise InvalidRequestError(f"top_logprobs_num must be >= 0, got {n}", "top_logprobs_num")
    if n > MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"top_logprobs_num must be <= {MAX_TOP_LOGPROBS}, got {n}", "top_logprobs_num")


def validate_logprob_start_len(start: int, input_len: int, return_logprob: bool) -> None:
    """Raise ``InvalidRequestError`` (param ``logprob_start_len``) unless ``start`` is -1 (output
    tokens only) or a prompt position: ``0 <= start < input_len`` (tokens). As in SGLang, the
    position only matters, and is only checked, when ``return_logprob`` is set."""
    if start < -1:
        raise InvalidRequestError(f"logprob_start_len must be >= -1, got {start}", "logprob_start_len")
    if return_logprob and start >= input_len:
        raise InvalidRequestError(f"logprob_start_len ({start}) should be less than the input length "
                                  f"({input_len} tokens): it is the first prompt position to return "
                                  f"logprobs for (-1: output tokens only)", "logprob_start_len")


def validate_generate_input(input_ids: list[int], params: SamplingParams, vocab_size: int,
                            context_len: int, strict_max_new_tokens: bool = False) -> None:
    """Raise ``InvalidRequestError`` for an empty or too-long prompt, out-of-vocabulary ids or bad
    sampling values. With ``strict_max_new_tokens``, a ``max_new_tokens`` that cannot fit in the
    context is an error too (the HTTP edge); otherwise it is clamped later."""
    n = len(input_ids)
    if n == 0:
        raise InvalidRequestError("the input is empty (no tokens): give a non-empty prompt", "input_ids")
    if n >= context_len:
        raise InvalidRequestError(f"The input ({n} tokens) is longer than the model's context length "
                                  f"({context_len} tokens)", "input_ids")
    for t in input_ids:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise InvalidRequestError(f"input token id {t!r} is outside the vocabulary [0, {vocab_size})",
                                      "input_ids")
    try:
        params.verify(vocab_size)
    except SamplingParamsError as e:
        raise InvalidRequestError(str(e), e.param) from None
    if strict_max_new_tokens and params.max_new_tokens is not None and n + params.max_new_tokens > context_len:
        raise InvalidRequestError(
            f"Requested token count exceeds the model's context length: the input has {n} tokens and "
            f"max_new_tokens is {params.max_new_tokens}, together more than {context_len}: max_new_tokens must be "
            f"in [0, {context_len - n}] for this input", "max_new_tokens")
