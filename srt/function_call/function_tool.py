"""A function tool as the parsers and grammars see it (validated from an OpenAI ``tools`` entry
by ``radixlm.srt.openai_api.tool_request``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

# A function that takes no arguments (OpenAI: omitted ``parameters`` = an empty parameter list).
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    """OpenAI's ``{"type": "function", "function": {name, description, parameters, strict}}``.

    ``parameters`` is a JSON Schema of ``type: object`` (the arguments object).
    """

    name: str
    parameters: dict[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS))
    description: Optional[str] = None
    strict: Optional[bool] = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI tool object (what chat templates get as ``tools``)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}
