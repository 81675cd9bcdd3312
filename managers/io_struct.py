"""Messages between the TokenizerManager, the Scheduler and the DetokenizerManager.

Every message is a tagged ``msgspec.Struct`` of plain data (ints, strs, lists, nested structs of this
module), never tensors or scheduler objects. ``encode``/``decode`` turn them into msgpack bytes with a
type tag; an unknown tag raises ``msgspec.ValidationError``. No pickle on the wire.

Per-token outputs travel batched (one ``BatchTokenOut`` per scheduler step, struct of arrays) and
carry only what is new since the previous send for that request.
"""

from __future__ import annotations

from typing import Optional, Union

import msgspec

from radixlm.srt.sampling_params import SamplingParams


class FinishReason(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Why a request ended. ``type`` is ``stop`` | ``length`` | ``abort``.

    stop: ``matched`` is the stop string or token id that matched (None for a grammar end).
    length: ``length`` is the number of generated tokens; ``message`` says why when the limit was
        the KV pool's capacity rather than the request's ``max_new_tokens``.
    abort: ``message`` says why; ``status_code`` is the HTTP status to report (400 for bad input);
        ``param`` names the sampling field at fault when one is (e.g. ``"json_schema"`` for a
        grammar that does not compile; not part of ``to_json``).
    """

    type: str
    matched: Optional[Union[int, str]] = None
    length: Optional[int] = None
    message: Optional[str] = None
    status_code: Optional[int] = None
    param: Optional[str] = None

    def to_json(self) -> dict:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            out = {"type": "length", "length": self.length}
            if self.message is not None:  # e.g. max_new_tokens was cut to the KV pool's capacity
                out["message"] = self.message
            return out
        out: dict = {"type": "abort", "message": self.message}
        if self.status_code is not None:
            out["status_code"] = self.status_code
        return out


class TokenizedGenerateReq(msgspec.Struct, tag=True, kw_only=True):
    """One generation request, already tokenized (TokenizerManager -> Scheduler)."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output tokens only
    top_logprobs_num: int = 0
    stream: bool = False


class AbortReq(msgspec.Struct, tag=True, kw_only=True):
    """Abort requests whose rid starts with ``rid`` (SGLang's prefix semantics for /abort_request),
    exactly ``rid`` when ``exact`` (a disconnected client must not abort ``req10`` for ``req1``),
    or all of them."""

    rid: str = ""
    abort_all: bool = False
    exact: bool = False
    message: str = "Aborted by request"


class FlushCacheReq(msgspec.Struct, tag=True):
    """Reset the radix tree and pools (and the hierarchical cache's host tier); refused while any
    request is queued or running. ``storage``: instead, delete the storage tier's page files."""

    storage: bool = False


class FlushCacheOut(msgspec.Struct, tag=True, kw_only=True):
    success: bool
    message: str = ""


class GetInternalStateReq(msgspec.Struct, tag=True):
    """Ask the scheduler for its counters (used by /get_server_info, /metrics and tests)."""


class InternalState(msgspec.Struct, tag=True, kw_only=True):
    """Scheduler counters. Sizes are in tokens (KV slots)."""

    max_total_num_tokens: int
    available_size: int
    evictable_size: int
    protected_size: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_retractions: int
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    page_size: int
    context_len: int
    num_grammar_compiles: int = 0
    num_grammar_cache_hits: int = 0
    gen_throughput: float = 0.0  # tokens/s over the last decode log window (--decode-log-interval steps)
    new_token_ratio: float = 0.0  # the admission's estimate of how much of max_new_tokens requests use
    # Speculative decoding since start (0 while off): request-steps that verified a draft, drafted
    # tokens, drafted tokens accepted, output tokens of verify steps (accepted + bonus).
    num_spec_verify_steps: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_drafts: int = 0
    num_spec_verify_tokens: int = 0
    attention_backend: str = ""  # the backends actually chosen (``auto`` resolved)
    gemm_backend: str = ""
    elementwise_backend: str = ""
    quantization: str = ""  # the resolved --quantization: none | int8 | gguf
    quantized_layers: dict[str, int] = {}  # linear layers per weight format (``dense``: kept float)
    # Hierarchical cache (empty without it): prompt tokens served per tier since start
    # (``cached_tokens_device`` / ``_host`` / ``_storage``) and the controller's ``state()``.
    hicache: dict[str, float] = {}


class BatchTokenOut(msgspec.Struct, tag=True, kw_only=True):
    """New tokens of a batch of requests (Scheduler -> Detokenizer), struct of arrays.

    Index ``i`` of every list describes request ``rids[i]``. ``output_ids[i]`` holds only the ids
    new since the last send; ``finished_reasons[i]`` is None until the request ends, and is set
    exactly once per rid. Logprob lists hold entries for the new ids only; input logprobs are sent
    once, with the first output. Each top-logprob entry is a list of ``[logprob, token_id]`` pairs.
    """

    rids: list[str]
    output_ids: list[list[int]]
    finished_reasons: list[Optional[FinishReason]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    skip_special_tokens: list[bool]
    spaces_between_special_tokens: list[bool]
    no_stop_trim: list[bool]
    include_stop_str: list[bool]  # vLLM's include_stop_str_in_output (SamplingParams)
    # Stop strings of each request, sent with its first entry only (None afterwards): the
    # detokenizer holds back streamed text that could still become a stop string.
    stop_strs: list[Optional[list[str]]]
    # The last few prompt ids, sent with a request's first entry only: decoding the output with
    # this context keeps a SentencePiece leading space and byte merges at the boundary right.
    input_tail_ids: list[Optional[list[int]]]
    output_token_logprobs: list[Optional[list[float]]]
    output_top_logprobs: list[Optional[list[list[tuple[float, int]]]]]
    input_token_logprobs: list[Optional[list[Optional[float]]]]
    input_token_ids: list[Optional[list[int]]]
    input_top_logprobs: list[Optional[list[Optional[list[tuple[float, int]]]]]]
    num_retractions: list[int]
    # Hierarchical cache: cached tokens per tier ({"device", "host"[, "storage"]}); None without it.
    cached_tokens_details: list[Optional[dict[str, int]]] = []
    # Speculative decoding, per request (None while it is off): verify steps so far, and the output
    # tokens they produced (accepted drafts + bonus tokens).
    spec_verify_ct: list[Optional[int]] = msgspec.field(default_factory=list)
    spec_accepted_tokens: list[int] = msgspec.field(default_factory=list)


class BatchStrOut(msgspec.Struct, tag=True, kw_only=True):
    """``BatchTokenOut`` plus incremental text (Detokenizer -> TokenizerManager).

    ``output_strs[i]`` is the text new since the last send (never a broken UTF-8 character, never
    the start of a stop string that may still match).
    """

    token_out: BatchTokenOut
    output_strs: list[str]


Message = Union[
    TokenizedGenerateReq,
    AbortReq,
    FlushCacheReq,
    FlushCacheOut,
    GetInternalStateReq,
    InternalState,
    BatchTokenOut,
    BatchStrOut,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    """Serialize a message to tagged msgpack bytes."""
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """Deserialize tagged msgpack bytes; raises ``msgspec.ValidationError`` on an unknown tag."""
    return _decoder.decode(data)
