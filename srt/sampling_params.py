"""Per-request sampling parameters, with SGLang's field names and defaults.

Follows SGLang's ``srt/sampling/sampling_params.py`` contract (and its ``/generate`` docs). The struct is plain data (a ``msgspec.Struct``),
so it travels on the wire inside ``TokenizedGenerateReq`` without pickle.

``None`` in an incoming dict means "use the default", as SGLang's own frontend sends every field
with unset ones as JSON ``null``.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional, Union

import msgspec

_GREEDY_TEMPERATURE = 1e-6
# Integers cross to the scheduler as msgpack int64: a seed is a 64-bit signed integer (vLLM's range for
# ``seed``), and no other integer field may exceed INT64_MAX (beyond it the request could not be sent).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def copy_seed(seed: int, j: int) -> int:
    """The ``sampling_seed`` of copy ``j`` of an ``n > 1`` request: ``seed + j`` wrapped into
    ``[INT64_MIN, INT64_MAX]``. The sampler takes seeds modulo 2**64, so the wrap changes no sample;
    it keeps a seed near INT64_MAX encodable."""
    return (seed + j - INT64_MIN) % (1 << 64) + INT64_MIN


def sample_copies(params: "SamplingParams", n: int) -> list["SamplingParams"]:
    """The ``n`` single-sample requests of an ``n > 1`` request: copy ``j`` has ``n = 1`` and, with a
    ``sampling_seed``, ``copy_seed(seed, j)`` (as ``/v1`` gives choice ``j``): n copies of one seed would
    be n identical samples."""
    seed = params.sampling_seed
    return [msgspec.structs.replace(params, n=1, sampling_seed=None if seed is None else copy_seed(seed, j))
            for j in range(n)]


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range or of the wrong type (maps to HTTP 400).

    ``param``: the offending field's name (e.g. ``"stop"``), or None when no single field is at fault.
    """

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


class SamplingParams(msgspec.Struct, kw_only=True):
    """Sampling and stopping controls of one request.

    Fields (units are tokens unless said otherwise):
        max_new_tokens: cap on generated tokens (default 128); 0 only prefills and caches the prompt.
        min_new_tokens: EOS and ``stop_token_ids`` are masked until this many tokens exist.
        stop: stop strings (str or list of str); matched across token boundaries.
        stop_regex: regular expressions (Python ``re``) searched in the recent output text; the
            match is kept in the text and reported as ``finish_reason.matched``.
        stop_token_ids: extra token ids that end generation.
        temperature: softmax temperature; below 1e-6 means greedy.
        top_p: nucleus mass in (0, 1]. top_k: -1 = whole vocabulary, else >= 1.
        min_p: in [0, 1], drops tokens with prob < min_p * max prob.
        frequency_penalty, presence_penalty: in [-2, 2], over output tokens (OpenAI semantics).
        repetition_penalty: in (0, 2], 1 = off: a logit of a token already in the prompt or output
            is divided by it when positive, multiplied when not (HF / vLLM / SGLang semantics).
        logit_bias: token id (str or int) -> additive bias.
        sampling_seed: per-request seed in [INT64_MIN, INT64_MAX]; same seed + same prompt gives the
            same text in any batch.
        ignore_eos, skip_special_tokens, spaces_between_special_tokens, no_stop_trim: as SGLang.
        include_stop_str_in_output: vLLM's: the text ends right after the matched stop string (where
            no_stop_trim keeps the rest of the token that completed it); a stop token's text is kept.
        json_schema, regex, ebnf, structural_tag: grammar constraints (at most one);
            ``structural_tag`` is xgrammar's ``{"type": "structural_tag", "format": ...}`` as JSON
            text or an object (SGLang's field; what tool calling constrains with).
        n: parallel samples (expanded by the tokenizer manager).
    """

    max_new_tokens: Optional[int] = 128
    min_new_tokens: int = 0
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[dict[str, float]] = None
    sampling_seed: Optional[int] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    include_stop_str_in_output: bool = False
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    n: int = 1
    stream_interval: Optional[int] = None

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "SamplingParams":
        """Build from a JSON-like dict; ``None`` values take defaults; unknown keys are errors. Types
        are strict: a string is not a number, a number not a bool, ``5.0`` not an int (an int is a
        valid float).

        Raises:
            SamplingParamsError: unknown field or a value of the wrong type.
        """
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise SamplingParamsError(f"sampling_params must be an object, got {type(d).__name__}")
        known = set(cls.__struct_fields__)
        # Unknown keys sent as null are tolerated: SGLang's frontend sends every field it knows.
        unknown = sorted(k for k, v in d.items() if k not in known and v is not None)
        if unknown:
            raise SamplingParamsError(f"unknown sampling parameter(s): {', '.join(unknown)}", unknown[0])
        clean = {k: v for k, v in d.items() if v is not None and k in known}
        for name in ("json_schema", "structural_tag"):
            if isinstance(clean.get(name), (dict, list)):
                clean[name] = msgspec.json.encode(clean[name]).decode()
        if "logit_bias" in clean and isinstance(clean["logit_bias"], dict):
            clean["logit_bias"] = {str(k): v for k, v in clean["logit_bias"].items()}
        try:
            # strict: "5" is not an int nor 1 a bool (as in the request models and /openapi.json)
            return msgspec.convert(clean, cls, strict=True)
        except msgspec.ValidationError as e:
            raise SamplingParamsError(f"invalid sampling_params: {e}") from None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_TEMPERATURE or self.top_k == 1

    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def stop_regexes(self) -> list[str]:
        if self.stop_regex is None:
            return []
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)

    def verify(self, vocab_size: int) -> None:
        """Check ranges; raise ``SamplingParamsError`` with a message naming the field."""
        def finite(name: str, v: float) -> None:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise SamplingParamsError(f"{name} must be a finite number, got {v!r}", name.split("[")[0])

        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            finite(name, getattr(self, name))
        if self.temperature < 0:
            raise SamplingParamsError(f"temperature must be >= 0, got {self.temperature}", "temperature")
        if not 0 < self.top_p <= 1:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if not (self.top_k == -1 or 1 <= self.top_k <= INT64_MAX):
            raise SamplingParamsError(f"top_k must be -1 (disabled) or in [1, {INT64_MAX}], got {self.top_k}", "top_k")
        if self.sampling_seed is not None and not INT64_MIN <= self.sampling_seed <= INT64_MAX:
            raise SamplingParamsError(f"sampling_seed must be in [{INT64_MIN}, {INT64_MAX}] (a 64-bit integer), "
                                      f"got {self.sampling_seed}", "sampling_seed")
        if not 0 <= self.min_p <= 1:
            raise SamplingParamsError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not -2 <= v <= 2:
                raise SamplingParamsError(f"{name} must be in [-2, 2], got {v}", name)
        if not 0 < self.repetition_penalty <= 2:
            raise SamplingParamsError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}",
                                      "repetition_penalty")
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise SamplingParamsError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}", "max_new_tokens")
        if self.min_new_tokens < 0:
            raise SamplingParamsError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}", "min_new_tokens")
        if self.stream_interval is not None and not 1 <= self.stream_interval <= INT64_MAX:
            raise SamplingParamsError(f"stream_interval must be in [1, {INT64_MAX}], got {self.stream_interval}",
                                      "stream_interval")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise SamplingParamsError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                f"({self.max_new_tokens})", "min_new_tokens")
        if self.n < 1:
            raise SamplingParamsError(f"n must be >= 1, got {self.n}", "n")
        for tid in self.stop_token_ids or []:
            if not 0 <= tid < vocab_size:
                raise SamplingParamsError(
                    f"stop_token_ids entry {tid} is outside the vocabulary [0, {vocab_size})", "stop_token_ids")
        for s in self.stop_strs():
            if not s:
                raise SamplingParamsError("stop strings must be non-empty", "stop")
        for pattern in self.stop_regexes():
            try:
                re.compile(pattern)
            except re.error as e:
                raise SamplingParamsError(f"stop_regex {pattern!r} is not a valid regular expression: {e}",
                                          "stop_regex") from None
        for key, bias in (self.logit_bias or {}).items():
            try:
                tid = int(key)
            except ValueError:
                raise SamplingParamsError(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
            if not 0 <= tid < vocab_size:
                raise SamplingParamsError(
                    f"logit_bias token id {tid} is outside the vocabulary [0, {vocab_size})", "logit_bias")
            finite(f"logit_bias[{key}]", bias)
        grammars = [g for g in (self.json_schema, self.regex, self.ebnf, self.structural_tag) if g is not None]
        if len(grammars) > 1:
            raise SamplingParamsError("only one of json_schema, regex, ebnf and structural_tag may be given")

