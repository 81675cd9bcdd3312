"""What a request asks its output to match: ``GrammarSpec`` and the ``GrammarError`` it may raise.

A spec is plain, hashable data (the grammar cache's key is the spec itself, i.e. ``(kind, text)``);
nothing here imports a grammar library.

Kinds:
    * ``json_schema``: ``text`` is a JSON Schema document (a JSON string). Property order in the
      schema is the order of the generated keys, so the text is kept verbatim (not canonicalised).
    * ``json_object``: any JSON object (OpenAI ``response_format={"type": "json_object"}``);
      ``text`` is ignored by the backends (kept as ``""``). The schema text ``"$$ANY$$"`` (SGLang's
      key for "any JSON") and the bare schema ``{"type": "object"}`` map here too.
    * ``regex``: the whole output must fully match ``text``.
    * ``ebnf``: a GBNF/EBNF grammar with a ``root`` rule (xgrammar only).
    * ``structural_tag``: an xgrammar structural tag, ``{"type": "structural_tag", "format": {...}}``
      as JSON text (SGLang's ``structural_tag`` sampling parameter; xgrammar only). Tool calling
      builds these (``radixlm.srt.function_call.grammar``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

GrammarKind = Literal["json_schema", "json_object", "regex", "ebnf", "structural_tag"]
GRAMMAR_KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "ebnf", "structural_tag")
_PARAM_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")  # sampling params naming a kind
ANY_JSON_KEY = "$$ANY$$"


class GrammarError(ValueError):
    """An invalid or unsupported grammar (schema, regex, EBNF, or a kind the backend lacks).

    The message is the compiler's own (log prefixes stripped), meant for an HTTP 400 body.
    """


@dataclass(frozen=True)
class GrammarSpec:
    """One request's grammar. Hashable; equal specs share one compiled grammar in the cache."""

    kind: GrammarKind
    text: str

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r}; expected one of {GRAMMAR_KINDS}")
        if not isinstance(self.text, str):
            raise GrammarError(f"grammar text must be a string, got {type(self.text).__name__}")

    @classmethod
    def json_schema(cls, schema: Union[str, dict[str, Any], bool]) -> "GrammarSpec":
        """A JSON-schema spec from schema text or a decoded schema (dict/bool, encoded compactly).

        ``"$$ANY$$"`` and a bare ``{"type": "object"}`` schema (no other keyword) give the
        ``json_object`` spec, so both share one compiled any-object grammar. Invalid JSON is kept
        as is: the backend's compile reports it.
        """
        if not isinstance(schema, str):
            schema = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        if schema.strip() == ANY_JSON_KEY:
            return cls.json_object()
        if "object" in schema and len(schema) < 64:
            try:
                if json.loads(schema) == {"type": "object"}:
                    return cls.json_object()
            except ValueError:
                pass
        return cls("json_schema", schema)

    @classmethod
    def json_object(cls) -> "GrammarSpec":
        return cls("json_object", "")

    @classmethod
    def from_sampling_params(cls, params: Any) -> Optional["GrammarSpec"]:
        """The spec a request's sampling params ask for, or None when unconstrained.

        Args:
            params: a ``radixlm.srt.sampling_params.SamplingParams`` (reads its ``json_schema``,
                ``regex``, ``ebnf`` and ``structural_tag`` fields; ``json_schema`` may be a str or
                a decoded object).
        Raises:
            GrammarError: more than one of the four is set.
        """
        fields = {name: getattr(params, name, None) for name in _PARAM_KINDS}
        given = [name for name, value in fields.items() if value is not None]
        if not given:
            return None
        if len(given) > 1:
            raise GrammarError(f"only one of json_schema, regex, ebnf and structural_tag may be given, got {given}")
        name = given[0]
        value: Any = fields[name]
        if name == "json_schema":
            return cls.json_schema(value)
        return cls(name, str(value))  # type: ignore[arg-type]
