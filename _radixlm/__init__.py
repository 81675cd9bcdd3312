"""radixlm: a radix-cache LLM serving runtime.

The package root stays import-light: ``import radixlm`` (and ``import radixlm.lang``) must not
import torch. ``radixlm.Engine`` is resolved lazily on first access.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Engine", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixlm.srt.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
