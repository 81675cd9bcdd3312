"""The process-wide default backend (``set_default_backend``) and backend resolution.

This is the one piece of global state of the frontend, as in SGLang: programs run without a
``backend=`` argument use the default set here.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from radixlm.lang.backend import Backend


class _Defaults:
    def __init__(self) -> None:
        self.backend: Optional[Backend] = None
        self.lock = threading.Lock()


_DEFAULTS = _Defaults()


def as_backend(obj: Any) -> Backend:
    """A Backend itself, or the ``.endpoint`` of a ``Runtime``."""
    if isinstance(obj, Backend):
        return obj
    endpoint = getattr(obj, "endpoint", None)
    if isinstance(endpoint, Backend):
        return endpoint
    raise TypeError(f"not a backend: {obj!r} (use RuntimeEndpoint, Runtime or Engine)")


def set_default_backend(backend: Any) -> None:
    """Make ``backend`` (a RuntimeEndpoint, Engine or Runtime) the default of every program run."""
    resolved = as_backend(backend)
    with _DEFAULTS.lock:
        _DEFAULTS.backend = resolved


def get_default_backend() -> Optional[Backend]:
    with _DEFAULTS.lock:
        return _DEFAULTS.backend


def resolve_backend(backend: Any = None) -> Backend:
    """``backend`` if given, else the default; raises RuntimeError when there is neither."""
    if backend is not None:
        return as_backend(backend)
    default = get_default_backend()
    if default is None:
        raise RuntimeError("no backend: call radixlm.lang.set_default_backend(...) or pass backend=...")
    return default
