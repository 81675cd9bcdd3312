"""Token sampling through FlashInfer's fused kernels on CUDA, torch everywhere else.

``sample(logits, info)`` is a drop-in for ``radixlm.kernels.sampling.sample``. It takes FlashInfer's
path only where the result is distributed the same way (SGLang's ``layers/sampler.py`` does the
same): logits on a CUDA device, flashinfer importable, some row not greedy, no row with a
``sampling_seed`` (FlashInfer's Philox stream depends on the row's batch position, which would break
"a seeded row depends only on (seed, step, logits)") and no min-p. Everything else, including every
CPU call, goes to the torch implementation unchanged.

FlashInfer API (``flashinfer.sampling``, stable since 0.2; checked against 0.7.2.post1):
``top_k_top_p_sampling_from_probs(probs (bs, V) float32, top_k (bs,) int32, top_p (bs,) float32,
filter_apply_order="joint") -> (bs,) int32`` (rejection sampling, no sort), and
``sampling_from_probs(probs) -> (bs,) int32`` when neither filter is used. ``"joint"`` matches our
convention that top-k and top-p are judged on the same distribution. A token whose preceding mass
equals top_p exactly may be kept by one implementation and not the other; nothing else differs.
If FlashInfer's kernels cannot be built or run here (its JIT needs nvcc and curand headers), the
first failure is logged and every later call takes the torch path.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Optional

import torch

from radixlm.kernels import sampling as torch_sampling
from radixlm.kernels.sampling import SamplingBatchInfo

logger = logging.getLogger(__name__)
# Process-wide capability, like the import cache below: set at the first failure of the kernels.
_broken: list[str] = []


@functools.lru_cache(maxsize=1)
def _flashinfer_sampling() -> Optional[Any]:
    try:
        import flashinfer.sampling as fs
    except Exception:  # not installed, or no CUDA toolchain to import it with
        return None
    return fs


def use_flashinfer(logits: torch.Tensor, info: SamplingBatchInfo) -> bool:
    """Whether ``sample`` would take FlashInfer's kernels for this batch (see the module docstring)."""
    return (logits.is_cuda and not info.is_all_greedy and not info.seeded_rows and not info.need_min_p
            and not _broken and _flashinfer_sampling() is not None)


def sample(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Pick the next token of every row; ``logits`` (bs, V) is not modified.

    Returns:
        (bs,) int64 token ids on the logits' device. Greedy rows are ``torch.argmax`` exactly on
        both paths.
    """
    if not use_flashinfer(logits, info):
        return torch_sampling.sample(logits, info)
    fs = _flashinfer_sampling()
    probs = torch_sampling.temperature_probs(logits, info.temperatures)
    try:
        if info.need_top_k or info.need_top_p:
            ids = fs.top_k_top_p_sampling_from_probs(probs, info.top_ks.to(torch.int32), info.top_ps,
                                                     filter_apply_order="joint")
        else:
            ids = fs.sampling_from_probs(probs)
    except RuntimeError as exc:  # JIT build or load failure: nothing was sampled yet
        _broken.append(str(exc))
        logger.warning("flashinfer sampling unavailable (%s); sampling with torch", str(exc)[-300:])
        return torch_sampling.sample(logits, info)
    ids = ids.to(torch.int64)
    if info.has_greedy:
        return torch.where(info.greedy_mask, torch.argmax(logits, dim=-1), ids)
    return ids
