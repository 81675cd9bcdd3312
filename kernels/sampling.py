"""Logits processing and token sampling for one decode/extend step, in pure torch.

Data flow per step (SGLang's ``layers/sampler.py`` order, SGLang's ``Sampler.forward``)::

    info = SamplingBatchInfo.from_requests(params, output_ids, vocab_size, stop_ids, device, prompt_ids)
    raw = logits.clone()                         # only if some request wants logprobs
    apply_logits_processors(logits, info, vocab_mask)    # in place
    next_ids = sample(logits, info)
    logprobs, top_vals, top_ids = compute_logprobs(raw, next_ids, top_k)

Conventions (all tensors live on the logits' device; bs = batch size, V = logits width):

* Greedy rows (``temperature < 1e-6`` or ``top_k == 1``) take exactly ``torch.argmax`` of the
  processed logits; a batch of only greedy rows never computes a softmax.
* Filters are *joint*, as SGLang/FlashInfer ``filter_apply_order="joint"``: top-k, top-p and min-p
  are all judged on the same temperature-scaled distribution (no renormalisation in between).
* top-p keeps the smallest prefix of the sorted distribution whose mass reaches ``top_p``: a token
  is dropped when the mass ranked strictly before it is ``>= top_p`` (Holtzman et al.'s nucleus and
  vLLM's ``cumsum_ascending <= 1 - p`` rule; SGLang's torch fallback uses ``>`` and so also keeps a
  token whose preceding mass equals ``top_p`` exactly). Float32 softmax sums are inexact, so
  "reaches" allows ``_TOP_P_SLACK`` (1e-6) of slack: with probs [0.5, 0.3, 0.15, 0.05] and
  top_p = 0.8 only ids 0 and 1 survive. Rows with top_p = 1 are never trimmed, and the top-ranked
  token always survives.
* Draws use the exponential race: ``argmax(probs / E)`` with ``E ~ Exp(1)`` i.i.d. per token picks
  token ``i`` with probability ``probs[i] / sum(probs)``, so filtered probabilities need no
  renormalisation. A row with a ``sampling_seed`` draws ``E`` from its own generator seeded by
  ``generator_seed(seed, step)``: its token depends only on (seed, step, that row's logits, device),
  never on the other rows or its position in the batch.
* A row whose logits are all ``-inf`` (e.g. a grammar that only allows EOS while
  ``min_new_tokens`` masks EOS) has no valid token; it returns id 0 both greedily and sampled.
  The caller must not build such rows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from radixlm.kernels.argmax import argmax_rows
from radixlm.srt.sampling_params import SamplingParams

_TOP_P_SLACK = 1e-6
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class TokenUpdates:
    """Sparse per-(row, token) values for a (bs, V) logits tensor; no (row, token) pair repeats.

    rows, token_ids: (n,) int64; values: (n,) float32. All on the batch's device.
    """

    rows: torch.Tensor
    token_ids: torch.Tensor
    values: torch.Tensor


@dataclass
class SamplingBatchInfo:
    """Per-batch sampling tensors built once per step from the requests' SamplingParams.

    bs = batch size, V = ``vocab_size`` = width of the logits (may exceed the tokenizer's
    vocabulary when the lm_head is padded). Rows that do not use a feature hold its neutral value
    (greedy rows hold temperature 1.0, top_p 1.0, top_k V, min_p 0.0), so every tensor op is safe on
    the whole batch. The ``need_*`` flags and ``top_k_max`` only look at non-greedy rows.
    """

    temperatures: torch.Tensor  # (bs, 1) float32; greedy rows hold 1.0 (unused)
    top_ps: torch.Tensor  # (bs,) float32 in (0, 1]
    top_ks: torch.Tensor  # (bs,) int64 in [1, V]; -1 in the params -> V
    min_ps: torch.Tensor  # (bs,) float32 in [0, 1]
    greedy_mask: torch.Tensor  # (bs,) bool
    is_all_greedy: bool
    need_top_p: bool
    need_top_k: bool
    need_min_p: bool
    seeds: list[Optional[int]]  # per-row sampling_seed
    steps: list[int]  # per-row number of output tokens so far
    vocab_size: int
    has_greedy: bool = False  # any greedy row (the sampled path then merges in argmax rows)
    top_k_max: int = 0  # max top_k over sampled rows (bounds torch.topk); 0 when all greedy
    # (row, generator seed) for every non-greedy row with a sampling_seed.
    seeded_rows: tuple[tuple[int, int], ...] = ()
    # Sparse logit edits; None when no row uses them, so the common path costs nothing.
    repetition: Optional[TokenUpdates] = None  # divides a positive logit, multiplies a negative one
    penalties: Optional[TokenUpdates] = None  # subtracted: freq * count + pres * (count > 0)
    min_tokens_block: Optional[TokenUpdates] = None  # -inf: EOS/stop ids before min_new_tokens
    logit_bias: Optional[TokenUpdates] = None  # added

    @property
    def edits_logits(self) -> bool:
        """Whether ``apply_logits_processors`` changes any logit (besides a vocab_mask): a caller may
        then need a copy of the raw logits (logprobs are of the model's distribution)."""
        return any(u is not None for u in (self.repetition, self.penalties, self.min_tokens_block, self.logit_bias))

    @classmethod
    def from_requests(
        cls,
        params: list[SamplingParams],
        output_ids: list[list[int]],
        vocab_size: int,
        stop_ids: list[frozenset[int]],
        device: Union[torch.device, str] = "cpu",
        prompt_ids: Optional[Sequence[Sequence[int]]] = None,
    ) -> "SamplingBatchInfo":
        """Build the batch's sampling state. Cost is O(bs) plus O(output tokens) for penalty rows
        (O(prompt + output tokens) for repetition_penalty rows).

        Args:
            params: one SamplingParams per row (already ``verify``-ed at the edge).
            output_ids: tokens generated so far by each row (penalties, min_new_tokens, steps).
            vocab_size: V, the logits width.
            stop_ids: per row, EOS + stop_token_ids; masked to -inf while
                ``len(output_ids[i]) < params[i].min_new_tokens``.
            device: where the tensors live (the logits' device).
            prompt_ids: each row's prompt ids, which repetition_penalty counts as seen as well
                (HF's RepetitionPenaltyLogitsProcessor, vLLM); None: none of the rows has one.
        Raises:
            ValueError: list lengths differ, V < 1, a token id (prompt, output, stop, logit_bias key)
                is outside [0, V), or a row has a repetition_penalty but no prompt_ids were given.
        """
        bs = len(params)
        if len(output_ids) != bs or len(stop_ids) != bs:
            raise ValueError(f"params ({bs}), output_ids ({len(output_ids)}) and stop_ids "
                             f"({len(stop_ids)}) must have one entry per row")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        greedy = [p.is_greedy for p in params]
        sampled = [p for p, g in zip(params, greedy) if not g]
        top_ks = [vocab_size if g or p.top_k < 0 else min(p.top_k, vocab_size)
                  for p, g in zip(params, greedy)]
        steps = [len(out) for out in output_ids]
        seeds = [p.sampling_seed for p in params]
        return cls(
            temperatures=torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                                      dtype=torch.float32, device=device).view(bs, 1),
            top_ps=torch.tensor([1.0 if g else p.top_p for p, g in zip(params, greedy)],
                                dtype=torch.float32, device=device),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
            min_ps=torch.tensor([0.0 if g else p.min_p for p, g in zip(params, greedy)],
                                dtype=torch.float32, device=device),
            greedy_mask=torch.tensor(greedy, dtype=torch.bool, device=device),
            is_all_greedy=not sampled,
            need_top_p=any(p.top_p < 1.0 for p in sampled),
            need_top_k=any(0 < p.top_k < vocab_size for p in sampled),
            need_min_p=any(p.min_p > 0.0 for p in sampled),
            seeds=seeds,
            steps=steps,
            vocab_size=vocab_size,
            has_greedy=any(greedy),
            top_k_max=max((k for k, g in zip(top_ks, greedy) if not g), default=0),
            seeded_rows=tuple((i, generator_seed(s, steps[i])) for i, s in enumerate(seeds)
                              if s is not None and not greedy[i]),
            repetition=_repetition_updates(params, prompt_ids, output_ids, vocab_size, device),
            penalties=_penalty_updates(params, output_ids, vocab_size, device),
            min_tokens_block=_min_tokens_updates(params, output_ids, stop_ids, vocab_size, device),
            logit_bias=_logit_bias_updates(params, vocab_size, device),
        )


def generator_seed(seed: int, step: int) -> int:
    """Mix (sampling_seed, step) into a 63-bit seed for ``torch.Generator.manual_seed``.

    Two rounds of splitmix64, so nearby seeds and steps give unrelated streams. Seeds are taken
    modulo 2**64 (negative and huge seeds are accepted).
    """
    return _splitmix64((_splitmix64(seed & _MASK64) + step) & _MASK64) >> 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _check_ids(ids: torch.Tensor, vocab_size: int, what: str) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{what} token id outside the vocabulary [0, {vocab_size})")


def _updates(rows: torch.Tensor, ids: torch.Tensor, values: torch.Tensor,
             device: Union[torch.device, str]) -> TokenUpdates:
    return TokenUpdates(rows.to(device), ids.to(device), values.to(device, torch.float32))


def _penalty_updates(params: list[SamplingParams], output_ids: list[list[int]], vocab_size: int,
                     device: Union[torch.device, str]) -> Optional[TokenUpdates]:
    """OpenAI frequency/presence penalties over each row's output tokens, one per seen token."""
    rows = [i for i, p in enumerate(params)
            if (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0) and output_ids[i]]
    if not rows:
        return None
    lengths = torch.tensor([len(output_ids[i]) for i in rows], dtype=torch.int64)
    row_idx = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), lengths)
    tokens = torch.tensor(list(itertools.chain.from_iterable(output_ids[i] for i in rows)),
                          dtype=torch.int64)
    _check_ids(tokens, vocab_size, "output")
    keys, counts = torch.unique(row_idx * vocab_size + tokens, return_counts=True)
    r, t = keys // vocab_size, keys % vocab_size
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32)[r]
    pres = torch.tensor([p.presence_penalty for p in params], dtype=torch.float32)[r]
    # count > 0 for every entry, so the presence term is pres * 1.
    return _updates(r, t, freq * counts.to(torch.float32) + pres, device)


def _repetition_updates(params: list[SamplingParams], prompt_ids: Optional[Sequence[Sequence[int]]],
                        output_ids: list[list[int]], vocab_size: int,
                        device: Union[torch.device, str]) -> Optional[TokenUpdates]:
    """repetition_penalty (Keskar et al. 2019, CTRL) over each row's prompt and output tokens: one
    (row, token, penalty) per distinct token seen."""
    rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if not rows:
        return None
    if prompt_ids is None or len(prompt_ids) != len(params):
        raise ValueError("repetition_penalty needs every row's prompt_ids")
    seen = [torch.unique(torch.tensor([*prompt_ids[i], *output_ids[i]], dtype=torch.int64)) for i in rows]
    ids = torch.cat(seen)
    _check_ids(ids, vocab_size, "prompt or output")
    counts = torch.tensor([len(t) for t in seen], dtype=torch.int64)
    row_idx = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), counts)
    penalty = torch.tensor([params[i].repetition_penalty for i in rows], dtype=torch.float32)
    return _updates(row_idx, ids, torch.repeat_interleave(penalty, counts), device)


def _min_tokens_updates(params: list[SamplingParams], output_ids: list[list[int]],
                        stop_ids: list[frozenset[int]], vocab_size: int,
                        device: Union[torch.device, str]) -> Optional[TokenUpdates]:
    pairs = [(i, t) for i, p in enumerate(params) if len(output_ids[i]) < p.min_new_tokens
             for t in sorted(stop_ids[i])]
    if not pairs:
        return None
    rows, ids = torch.tensor(pairs, dtype=torch.int64).unbind(1)
    _check_ids(ids, vocab_size, "stop")
    return _updates(rows, ids, torch.full((len(pairs),), float("-inf")), device)


def _logit_bias_updates(params: list[SamplingParams], vocab_size: int,
                        device: Union[torch.device, str]) -> Optional[TokenUpdates]:
    """Additive biases; keys naming the same id ("7" and "07") are summed."""
    merged: dict[tuple[int, int], float] = {}
    for i, p in enumerate(params):
        for key, bias in (p.logit_bias or {}).items():
            tid = int(key)
            if not 0 <= tid < vocab_size:
                raise ValueError(
                    f"logit_bias token id {tid} outside the vocabulary [0, {vocab_size})")
            merged[(i, tid)] = merged.get((i, tid), 0.0) + float(bias)
    if not merged:
        return None
    rows, ids = torch.tensor(list(merged), dtype=torch.int64).unbind(1)
    return _updates(rows, ids, torch.tensor(list(merged.values())), device)


def apply_logits_processors(logits: torch.Tensor, info: SamplingBatchInfo,
                            vocab_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Apply penalties, min_new_tokens, grammar mask and logit_bias to ``logits`` in place.

    Order (vLLM's): repetition_penalty (a logit of a token seen in the prompt or output divided by it
    when positive, multiplied when not; HF's RepetitionPenaltyLogitsProcessor), frequency/presence
    penalties (``logit -= freq * count + pres * (count > 0)``, counts over output tokens only),
    EOS/stop ids -> -inf before min_new_tokens, ``vocab_mask`` (disallowed -> -inf), logit_bias
    (added). With none of them this is a no-op.

    Args:
        logits: (bs, V) float32, modified in place.
        info: the batch's SamplingBatchInfo.
        vocab_mask: optional packed int32 bitmask (bs, ceil(V/32)) (xgrammar layout: bit j % 32 of
            word j // 32 set = token j allowed; all-ones rows are unconstrained); extra words
            beyond ceil(V/32) are ignored. Moved to the logits' device if needed.
    Returns:
        ``logits``.
    Raises:
        ValueError: vocab_mask has the wrong batch size or too few words.
    """
    if info.repetition is not None:
        upd = info.repetition
        idx = (upd.rows, upd.token_ids)
        current = logits[idx]
        logits.index_put_(idx, torch.where(current > 0, current / upd.values, current * upd.values))
    if info.penalties is not None:
        _add_at(logits, info.penalties, sign=-1.0)
    if info.min_tokens_block is not None:
        upd = info.min_tokens_block
        logits.index_put_((upd.rows, upd.token_ids), upd.values)
    if vocab_mask is not None:
        apply_vocab_mask(logits, vocab_mask)
    if info.logit_bias is not None:
        _add_at(logits, info.logit_bias, sign=1.0)
    return logits


def _add_at(logits: torch.Tensor, upd: TokenUpdates, sign: float) -> None:
    # Gather-add-scatter instead of index_put_(accumulate=True): pairs are unique, so this is exact
    # and deterministic on every device (no atomics).
    idx = (upd.rows, upd.token_ids)
    current = logits[idx]
    logits.index_put_(idx, current - upd.values if sign < 0 else current + upd.values)


def unpack_vocab_mask(vocab_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack a packed int32 bitmask (bs, W >= ceil(V/32)) into a bool (bs, V) "allowed" mask.

    Raises:
        ValueError: fewer than ceil(V/32) words per row, or not 2-D.
    """
    words = (vocab_size + 31) // 32
    if vocab_mask.dim() != 2 or vocab_mask.shape[1] < words:
        raise ValueError(
            f"vocab_mask must be (bs, >= {words}) int32, got {tuple(vocab_mask.shape)}")
    # AND with one constant per bit: a tensor-by-tensor right shift is ~1000x slower on CPU
    # (~20 ms vs ~0.02 ms at V = 49152). Bit 31 is the sign bit of an int32.
    bits = torch.tensor([1 << i if i < 31 else -(1 << 31) for i in range(32)], dtype=torch.int32,
                        device=vocab_mask.device)
    allowed = (vocab_mask[:, :words].to(torch.int32).unsqueeze(-1) & bits) != 0
    return allowed.view(vocab_mask.shape[0], words * 32)[:, :vocab_size]


def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> torch.Tensor:
    """Set disallowed tokens of ``logits`` (bs, V) to -inf in place; see ``unpack_vocab_mask``."""
    if vocab_mask.shape[0] != logits.shape[0]:
        raise ValueError(f"vocab_mask has {vocab_mask.shape[0]} rows, logits {logits.shape[0]}")
    allowed = unpack_vocab_mask(vocab_mask.to(logits.device, non_blocking=True), logits.shape[1])
    return logits.masked_fill_(~allowed, float("-inf"))


_FLOAT32_MAX = torch.finfo(torch.float32).max


def temperature_probs(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """softmax(logits / T) in float32, (bs, V) -> (bs, V), new tensor; temperatures (bs, 1).

    A logit that is +inf after the scaling (a huge logit_bias, or a small temperature) is taken as
    float32's largest value, so such tokens share the probability instead of turning the row into
    NaN (inf - inf) and the sample into token 0."""
    scaled = logits.float() / temperatures
    return torch.softmax(scaled.clamp_(max=_FLOAT32_MAX), dim=-1)


def sample(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Pick the next token of every row. ``logits`` is not modified.

    Args:
        logits: (bs, V) processed logits (float32; other float dtypes are upcast).
        info: the batch's SamplingBatchInfo.
    Returns:
        (bs,) int64 token ids on the logits' device. Greedy rows: ``torch.argmax(logits, -1)``
        exactly. Other rows: temperature -> softmax -> top-k / top-p / min-p -> exponential race.
    """
    if info.is_all_greedy:
        return argmax_rows(logits)
    probs = temperature_probs(logits, info.temperatures)
    if info.need_top_p:
        probs = _top_k_top_p_sorted(probs, info.top_ks, info.top_ps)
    elif info.need_top_k:
        probs = _top_k_threshold(probs, info.top_ks, info.top_k_max)
    if info.need_min_p:
        max_p = probs.amax(dim=-1, keepdim=True)  # the top token survives top-k/top-p
        probs.masked_fill_(probs < info.min_ps.unsqueeze(1) * max_p, 0.0)
    # Exponential race: the argmax is invariant to per-row scaling, so no renormalisation is needed.
    sampled = argmax_rows(probs.div_(_exponential_noise(probs.shape, info, probs.device)))
    if info.has_greedy:
        return torch.where(info.greedy_mask, argmax_rows(logits), sampled)
    return sampled


def _top_k_threshold(probs: torch.Tensor, top_ks: torch.Tensor, top_k_max: int) -> torch.Tensor:
    """Top-k without a full sort: drop probs below each row's k-th largest (ties at it survive)."""
    top_vals = torch.topk(probs, top_k_max, dim=-1, sorted=True).values  # (bs, k_max)
    kth = top_vals.gather(1, (top_ks.clamp(max=top_k_max) - 1).unsqueeze(1))
    return probs.masked_fill_(probs < kth, 0.0)


def _top_k_top_p_sorted(probs: torch.Tensor, top_ks: torch.Tensor,
                        top_ps: torch.Tensor) -> torch.Tensor:
    """Joint top-k and top-p on one stable descending sort (rule: see the module docstring)."""
    probs_sort, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    ranks = torch.arange(probs.shape[1], device=probs.device)
    drop = ranks.unsqueeze(0) >= top_ks.unsqueeze(1)
    mass_before = torch.cumsum(probs_sort, dim=-1) - probs_sort
    # Rows with top_p == 1 are exempt: the slack must not trim the tail of an unfiltered row.
    drop |= (mass_before >= (top_ps - _TOP_P_SLACK).unsqueeze(1)) & (top_ps < 1.0).unsqueeze(1)
    drop[:, 0] = False
    probs_sort.masked_fill_(drop, 0.0)
    return torch.empty_like(probs).scatter_(1, order, probs_sort)


def _exponential_noise(shape: torch.Size, info: SamplingBatchInfo,
                       device: torch.device) -> torch.Tensor:
    """(bs, V) Exp(1) noise; seeded rows from their own generator, the rest from the default RNG."""
    noise = torch.empty(shape, dtype=torch.float32, device=device)
    if len(info.seeded_rows) < shape[0]:
        noise.exponential_()
    if info.seeded_rows:
        gen = torch.Generator(device=device)
        for row, seed in info.seeded_rows:  # the one allowed per-row loop
            gen.manual_seed(seed)
            noise[row].exponential_(generator=gen)
    # An exact 0 would turn a filtered token's 0/0 into NaN, which argmax would pick.
    return noise.clamp_min_(torch.finfo(torch.float32).tiny)


def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top_k: int = 0
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Log-probabilities of the chosen tokens (and optionally the top-k) under the raw logits.

    Logprobs describe the model's own distribution: pass the logits *before* temperature,
    penalties, grammar mask and logit_bias (vLLM's default; SGLang returns the
    temperature-scaled one unless SGLANG_RETURN_ORIGINAL_LOGPROB is set). Since
    ``apply_logits_processors`` works in place, clone the raw logits first when needed.

    Args:
        logits: (bs, V) raw logits (any float dtype; computed in float32).
        token_ids: (bs,) integer ids, e.g. the output of ``sample``.
        top_k: number of top alternatives per row; 0 for none; clamped to V.
    Returns:
        (chosen (bs,) float32, top-k values (bs, k) float32 or None,
        top-k ids (bs, k) int64 or None), the top-k sorted by descending logprob.
    Raises:
        ValueError: top_k < 0 or token_ids not of shape (bs,).
    """
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if token_ids.shape != (logits.shape[0],):
        raise ValueError(f"token_ids must be ({logits.shape[0]},), got {tuple(token_ids.shape)}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, token_ids.long().unsqueeze(1)).squeeze(1)
    if top_k == 0:
        return chosen, None, None
    vals, ids = torch.topk(logprobs, min(top_k, logprobs.shape[1]), dim=-1)
    return chosen, vals, ids
