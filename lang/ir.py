"""IR of prompt programs: the nodes that ``s += ...`` submits and the interpreter executes.

A program is plain Python that appends nodes to a ``ProgramState``. Nodes are small immutable
values; ``a + b`` concatenates them into an ``ExprList``. ``GenParams`` holds the sampling fields of a
``gen`` (``None`` everywhere means "inherit the run-level default") and converts itself into the
``sampling_params`` dict of SGLang's ``/generate``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

# dtype -> (regex, extra stop strings); same constraints as SGLang's frontend.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""
_DTYPE_RULES = {
    "int": (REGEX_INT, (" ", "\n")),
    "float": (REGEX_FLOAT, (" ", "\n")),
    "bool": (REGEX_BOOL, ()),
    "str": (REGEX_STR, ()),
}

# Frontend run-level defaults (SGLang's): overridden by ``run(...)`` keywords, then by each gen.
RUN_DEFAULTS: dict[str, Any] = {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": -1}


def dtype_name(dtype: Union[type, str, None]) -> Optional[str]:
    """``int``/``"int"`` -> ``"int"``; raises ValueError for anything but int, float, bool, str."""
    if dtype is None:
        return None
    name = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", str(dtype))
    if name not in _DTYPE_RULES:
        raise ValueError(f"unsupported dtype {dtype!r}: use int, float, bool or str")
    return name


@dataclass(frozen=True)
class GenParams:
    """Sampling and logprob fields of one gen; ``None`` = inherit from the run-level defaults.

    ``max_new_tokens`` is what ``gen(max_tokens=...)`` sets. ``dtype`` turns into a regex (and stop
    strings for numbers) in :meth:`resolved`, taking precedence over an explicit ``regex``.
    """

    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    stop: Optional[Union[str, tuple[str, ...]]] = None
    stop_token_ids: Optional[tuple[int, ...]] = None
    stop_regex: Optional[Union[str, tuple[str, ...]]] = None
    n: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    regex: Optional[str] = None
    json_schema: Optional[str] = None
    dtype: Optional[str] = None
    sampling_seed: Optional[int] = None
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None

    _SAMPLING = ("max_new_tokens", "min_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature",
                 "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "regex",
                 "json_schema", "sampling_seed")
    _LOGPROB = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "GenParams":
        """Build from keyword arguments; unknown names raise TypeError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        for name in ("stop", "stop_regex"):
            if isinstance(kwargs.get(name), list):
                kwargs[name] = tuple(kwargs[name])
        if kwargs.get("stop_token_ids") is not None:
            kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
        if isinstance(kwargs.get("json_schema"), dict):
            import json

            kwargs["json_schema"] = json.dumps(kwargs["json_schema"])
        kwargs["dtype"] = dtype_name(kwargs.get("dtype"))
        return cls(**kwargs)

    def merged_over(self, base: "GenParams") -> "GenParams":
        """Fields of ``self`` that are not ``None`` override ``base``."""
        changes = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        return dataclasses.replace(base, **changes)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def resolved(self, extra_stop: Optional[str] = None) -> "GenParams":
        """Apply ``dtype`` (regex + stops) and add ``extra_stop`` (the chat template's stop string)."""
        stops, regex = self.stop_list(), self.regex
        if self.dtype is not None:
            regex, dtype_stops = _DTYPE_RULES[self.dtype]
            stops += [s for s in dtype_stops if s not in stops]
        if extra_stop and extra_stop not in stops:
            stops.append(extra_stop)
        return dataclasses.replace(self, stop=tuple(stops) if stops else None, regex=regex, dtype=None)

    def to_srt(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(sampling_params, top-level logprob fields)`` for ``/generate``; ``None`` fields omitted."""
        sp = {name: getattr(self, name) for name in self._SAMPLING if getattr(self, name) is not None}
        if "stop" in sp:
            sp["stop"] = self.stop_list()
        if "stop_token_ids" in sp:
            sp["stop_token_ids"] = list(sp["stop_token_ids"])
        if isinstance(sp.get("stop_regex"), tuple):
            sp["stop_regex"] = list(sp["stop_regex"])
        top = {name: getattr(self, name) for name in self._LOGPROB if getattr(self, name) is not None}
        return sp, top


class Expr:
    """Base of all IR nodes; ``a + b`` builds an :class:`ExprList` (strings become :class:`Text`)."""

    def __add__(self, other: Any) -> "ExprList":
        return ExprList(_flatten([self, other]))

    def __radd__(self, other: Any) -> "ExprList":
        return ExprList(_flatten([other, self]))


@dataclass(frozen=True)
class Text(Expr):
    """Constant text appended to the program."""

    value: str


@dataclass(frozen=True)
class Gen(Expr):
    """Generate text; stored in variable ``name`` (if given) with the server's meta info."""

    name: Optional[str]
    params: GenParams = field(default_factory=GenParams)


@dataclass(frozen=True)
class Select(Expr):
    """Pick one of ``choices`` by scoring their logprobs; the winner is appended and stored."""

    name: Optional[str]
    choices: tuple[str, ...]
    temperature: float = 0.0
    choices_method: Optional[Callable[..., Any]] = None


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    """Start capturing the text appended until the matching :class:`VarScopeEnd` into ``name``."""

    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    name: str


@dataclass(frozen=True)
class SeparateReasoning(Expr):
    """Split variable ``name`` (a finished gen or select) into its answer and its reasoning, by the tags
    of reasoning parser ``model_type`` (``radixlm.srt.reasoning_parser``, SGLang's names): ``name``
    keeps the answer, ``name + "_reasoning_content"`` gets the reasoning (SGLang's
    ``separate_reasoning``)."""

    name: str
    model_type: str

    @property
    def reasoning_name(self) -> str:
        return f"{self.name}_reasoning_content"


@dataclass(frozen=True)
class CommitLazy(Expr):
    """Prefill the current text into the server's cache (``max_new_tokens: 0``); used by ``fork``."""


@dataclass(frozen=True)
class ExprList(Expr):
    """A sequence of nodes executed in order."""

    items: tuple[Expr, ...]

    def __init__(self, items: Sequence[Expr]):
        object.__setattr__(self, "items", tuple(items))


def to_expr(value: Any) -> Expr:
    """Coerce what ``s += value`` accepts: an Expr, a str, an int or float (as text), or a list/tuple of them.

    Raises:
        TypeError: anything else (None, bool, bytes, a ProgramState, ...), as SGLang refuses unknown types.
    """
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, (list, tuple)):
        return ExprList(_flatten(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Text(str(value))  # numbers as text, as an f-string writes them
    hint = ""
    if type(value).__name__ == "ProgramState":
        hint = " (the result of running another program; to run it on this state, call it as sub(s, ...))"
    elif isinstance(value, (bytes, bytearray)):
        hint = " (decode bytes to str first)"
    raise TypeError(f"cannot append a {type(value).__name__} to a program{hint}: s += takes a str, a number, "
                    f"gen/select/role expressions, or a list of them")


def _flatten(values: Sequence[Any]) -> list[Expr]:
    out: list[Expr] = []
    for v in values:
        e = to_expr(v)
        out.extend(e.items if isinstance(e, ExprList) else [e])
    return out


def validate_regex(pattern: Optional[str]) -> None:
    """Reject a regex Python cannot compile before anything is sent (SGLang checks eagerly too)."""
    if pattern is not None:
        re.compile(pattern)


def walk(expr: Expr) -> list[Expr]:
    """The leaf nodes of ``expr`` in execution order."""
    return list(expr.items) if isinstance(expr, ExprList) else [expr]
