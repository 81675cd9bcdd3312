"""Prefix tracing: the constant text a program always starts with, found without generating.

The program runs on a synchronous executor whose backend stops at the first request (gen, select,
fork) and whose arguments are placeholders that stop on any use (``str``, f-strings, ``+``). The
text appended until then (role markup included) is the shared prefix ``run_batch`` caches once
before its threads start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from radixlm.lang.backend import Backend
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.ir import GenParams

if TYPE_CHECKING:
    from radixlm.lang.program import Program

MIN_PREFIX_CHARS = 64  # shorter prefixes are not worth a request


class StopTracing(Exception):
    """Raised where the traced program stops being constant."""


class _Placeholder:
    """Stands for an argument; any attempt to look at it ends the trace."""

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise StopTracing

    __str__ = __format__ = __add__ = __radd__ = __getitem__ = __iter__ = __len__ = __bool__ = _stop
    __eq__ = __lt__ = __int__ = __float__ = __contains__ = __getattr__ = _stop  # type: ignore[assignment]
    __hash__ = object.__hash__


class _TracingBackend(Backend):
    """Answers nothing: every request ends the trace. Roles use the real backend's template."""

    def __init__(self, real: Backend):
        super().__init__()
        self.real = real

    def request(self, body: dict[str, Any]) -> Any:
        raise StopTracing

    def request_stream(self, body: dict[str, Any]) -> Iterator[dict]:
        raise StopTracing

    def get_model_info(self) -> dict[str, Any]:
        return self.real.get_model_info()

    def get_chat_template(self) -> ChatTemplate:
        return self.real.get_chat_template()


def extract_prefix(program: "Program", backend: Backend) -> str:
    """The constant leading text of ``program`` (empty if it starts with a gen or an argument)."""
    from radixlm.lang.state import ProgramState

    executor = StreamExecutor(_TracingBackend(backend), GenParams(), use_thread=False)
    kwargs = {name: _Placeholder() for name in program.arg_names if name not in program.bound}
    try:
        program.func(ProgramState(executor), **{**program.bound, **kwargs})
    except Exception:  # StopTracing or anything the placeholders broke: the prefix ends here
        pass
    return executor.text_
