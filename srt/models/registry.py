"""Maps Hugging Face ``architectures`` names to our model classes (imported lazily)."""

from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": ("radixlm.srt.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("radixlm.srt.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("radixlm.srt.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("radixlm.srt.models.qwen3", "Qwen3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type:
    """Raises ValueError naming the supported architectures when ``architecture`` is unknown."""
    if architecture not in _MODELS:
        raise ValueError(f"model architecture {architecture!r} is not supported; supported: "
                         f"{', '.join(supported_architectures())}")
    module, name = _MODELS[architecture]
    return getattr(importlib.import_module(module), name)
