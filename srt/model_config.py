"""What the runtime needs to know about a model, read once from its resolved folder.

``ModelConfig.from_path`` resolves any model source (demo model, folder, ``.gguf``, hub id) through
:func:`radixlm.srt.model_loader.resolve_model_path`, then reads ``config.json`` with transformers'
``AutoConfig``. ``hf_config`` is kept intact (RoPE settings live in ``hf_config.rope_parameters``
under transformers 5) for model code; the flat fields are the ones the scheduler, the KV pool and
the attention backends size themselves with.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from radixlm.srt.model_loader import ModelLoadError, load_tokenizer, resolve_model_path

logger = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    """Immutable summary of a model; every size is a plain int (head_dim in elements per head)."""

    model_path: str  # the resolved local folder
    hf_config: Any  # transformers PretrainedConfig, untouched
    architecture: str  # hf_config.architectures[0], e.g. "LlamaForCausalLM"
    dtype: torch.dtype  # compute/weight dtype the runner should use
    context_len: int  # longest sequence (prompt + output) a request may reach
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]  # any of these ends generation (config, generation, tokenizer)

    @classmethod
    def from_path(
        cls,
        model_path: str | None,
        dtype: str = "auto",
        context_length: int | None = None,
        device: str = "cpu",
        cache_dir: str | None = None,
    ) -> ModelConfig:
        """Resolve ``model_path`` and read its configuration.

        Args:
            model_path: ``None`` for the demo model, a folder, a ``.gguf`` file or a hub id.
            dtype: ``"auto"`` (CPU: bfloat16 with AMX-BF16/AVX512-BF16, else float32; CUDA: the config's) or an explicit
                ``"float32" | "bfloat16" | "float16"`` (aliases ``float``, ``half``, ``bf16``...).
            context_length: overrides ``max_position_embeddings`` when given (must be > 0).
            device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; only affects the ``auto`` dtype.
            cache_dir: GGUF conversion cache root (see ``resolve_model_path``).

        Raises:
            ModelLoadError: the model cannot be resolved or its config.json cannot be parsed.
            ValueError: an unknown ``dtype`` or a non-positive ``context_length``.
        """
        from transformers import AutoConfig

        folder = resolve_model_path(model_path, cache_dir=cache_dir)
        try:
            hf_config = AutoConfig.from_pretrained(folder)
        except Exception as exc:
            raise ModelLoadError(f"cannot parse {os.path.join(folder, 'config.json')}: {exc}") from exc
        text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        architectures = getattr(hf_config, "architectures", None) or []
        if not architectures:
            raise ModelLoadError(f"{os.path.join(folder, 'config.json')} has no 'architectures'")
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        if heads % kv_heads:
            raise ModelLoadError(f"{folder}: {heads} attention heads not divisible by {kv_heads} KV heads")
        return cls(
            model_path=folder,
            hf_config=hf_config,
            architecture=str(architectures[0]),
            dtype=_pick_dtype(dtype, hf_config, device),
            context_len=_context_len(text, context_length, folder),
            vocab_size=int(text.vocab_size),
            hidden_size=int(text.hidden_size),
            num_hidden_layers=int(text.num_hidden_layers),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
            intermediate_size=int(getattr(text, "intermediate_size", 0) or 0),
            rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            eos_token_ids=_eos_token_ids(hf_config, folder),
        )


def _pick_dtype(dtype: str, hf_config: Any, device: str, cpu: Any = None) -> torch.dtype:
    """``auto``: on CPU, bfloat16 where the CPU has bf16 GEMM units (AMX-BF16 / AVX512-BF16), else
    float32 (bf16 is emulated and slower there); on CUDA the config's dtype. ``cpu``: a
    ``cpu_runtime.CpuInfo`` (default: this machine's)."""
    name = str(dtype).lower()
    if name != "auto":
        if name not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}")
        return _DTYPES[name]
    if not str(device).startswith("cuda"):
        from radixlm.srt.cpu_runtime import cpu_info, prefers_bf16

        return torch.bfloat16 if prefers_bf16(cpu if cpu is not None else cpu_info()) else torch.float32
    declared = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(declared, torch.dtype):
        return declared if declared in _DTYPES.values() else torch.float32
    return _DTYPES.get(str(declared).replace("torch.", ""), torch.float32)


# SGLang's switch (and ours) for a context_length beyond what the model was trained for.
ALLOW_LONGER_CONTEXT_ENV = ("RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")


def _context_len(text_config: Any, override: int | None, folder: str) -> int:
    """The model's context (``max_position_embeddings`` or a synonym), or ``override``.

    An override beyond the model's own context is refused, as SGLang refuses it (positions past it
    produce garbage, silently), unless ``RADIXLM_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` (or SGLang's
    ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``) is true, which logs a warning instead.
    """
    derived = _declared_context(lambda key: getattr(text_config, key, None))
    if override is None:
        if derived is None:
            raise ModelLoadError(f"{folder}: config.json gives no max_position_embeddings; pass context_length")
        return derived
    if int(override) <= 0:
        raise ValueError(f"context_length must be positive, got {override}")
    if derived is not None and int(override) > derived:
        refusal = _longer_context_refusal(int(override), derived)
        if refusal is not None:
            raise ValueError(refusal)
        logger.warning("context_length %d is longer than the model's own context (%d tokens); allowed by %s",
                       override, derived, ALLOW_LONGER_CONTEXT_ENV[0])
    return int(override)


def _declared_context(get: Any) -> Optional[int]:
    """The first positive int among the config's context-length keys (``get(key)`` reads one)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _longer_context_refusal(override: int, derived: int) -> Optional[str]:
    """Why ``override`` (> ``derived``) is refused, or None when the environment allows it."""
    if any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ALLOW_LONGER_CONTEXT_ENV):
        return None
    return (f"context_length {override} is longer than the model's own context ({derived} tokens, "
            f"max_position_embeddings): outputs past it are garbage. Set {ALLOW_LONGER_CONTEXT_ENV[0]}=1 "
            f"to allow it anyway")


def context_length_problem(folder: str, override: Optional[int]) -> Optional[str]:
    """The refusal ``ModelConfig.from_path`` would raise for ``context_length=override``, read from the
    folder's config.json alone (no transformers import: the launcher checks before starting any
    process); None when it is fine or cannot be told from the JSON (then from_path decides)."""
    path = os.path.join(folder, "config.json")
    if override is None or int(override) <= 0 or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    derived = _declared_context(text.get)
    return _longer_context_refusal(int(override), derived) if derived is not None and override > derived else None


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def _eos_token_ids(hf_config: Any, folder: str) -> tuple[int, ...]:
    """Union (first-seen order) of config, generation_config.json and tokenizer EOS ids."""
    ids = _as_ids(getattr(hf_config, "eos_token_id", None))
    gen_file = os.path.join(folder, "generation_config.json")
    if os.path.isfile(gen_file):
        try:
            with open(gen_file, encoding="utf-8") as fh:
                ids += _as_ids(json.load(fh).get("eos_token_id"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot parse {gen_file}: {exc}") from exc
    try:
        ids += _as_ids(load_tokenizer(folder).eos_token_id)
    except ModelLoadError:
        pass  # a weights-only folder: the config's ids are all we know
    return tuple(dict.fromkeys(ids))
