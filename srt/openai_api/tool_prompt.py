"""Tools and tool-use history in prompts.

A chat template that knows tools (its source uses a ``tools`` variable, as Hugging Face tool-use
templates do) gets them natively: ``apply_chat_template(messages, tools=[...])``, with each history
call's ``arguments`` decoded from OpenAI's JSON text to the object such templates expect.

Any other template gets radixlm's **default rendering**, plain messages every template can show:

* the tools go into the system turn (appended to the first system message, or a new one first):
  a short instruction, the tools' JSON (OpenAI's tool objects) between ``<tools>`` and
  ``</tools>``, and an example call in the server's tool-call format (``--tool-call-parser``;
  hermes by default: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``);
* an assistant message's ``tool_calls`` become text after its content, in that same format;
* ``tool`` messages become one ``user`` message per run of results, each result inside
  ``<tool_response>`` ... ``</tool_response>`` (ChatML-style templates and strict
  user/assistant alternation both render it).

``--chat-template FILE`` replaces either with the file's own rendering.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from radixlm.srt.function_call import FunctionTool, ToolCallParser
from radixlm.srt.openai_api.protocol import OpenAIError

_USES_TOOLS = re.compile(r"\btools\b")


def template_supports_tools(source: Optional[str]) -> bool:
    """Whether a template's Jinja source renders a ``tools`` variable."""
    return bool(source) and bool(_USES_TOOLS.search(source))  # type: ignore[arg-type]


def tool_system_prompt(tools: list[FunctionTool], parser: ToolCallParser) -> str:
    """The default rendering's tool section of the system turn."""
    listed = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more of the functions below to answer. Their signatures, as JSON "
            f"Schema, are inside <tools></tools>:\n<tools>\n{listed}\n</tools>\n\n"
            f"To call a function, write the call like this, nothing else around it:\n{parser.render_example()}")


def history_calls(message: dict[str, Any], i: int) -> list[tuple[str, Any]]:
    """``[(name, arguments object)]`` of an assistant message's ``tool_calls``. ``arguments`` that are
    not JSON (a call the token limit cut, fed back as it came) stay the string they are, as OpenAI
    accepts them.

    Raises:
        OpenAIError(400): a call without ``function.name``.
    """
    calls = []
    for j, call in enumerate(message.get("tool_calls") or []):
        where = f"messages.{i}.tool_calls.{j}.function"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise OpenAIError(f"{where}.name: each tool call needs a function name", 400, f"{where}.name")
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass  # the text as it is: the model sees what it wrote
        calls.append((fn["name"], arguments))
    return calls


def native_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a tool-aware template: arguments as objects (Hugging Face's convention)."""
    out = []
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            decoded = iter(history_calls(m, i))
            calls = []
            for call in m["tool_calls"]:
                name, arguments = next(decoded)
                calls.append({**call, "type": call.get("type", "function"),
                              "function": {**call["function"], "name": name, "arguments": arguments}})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def default_messages(messages: list[dict[str, Any]], tools: list[FunctionTool],
                     parser: ToolCallParser) -> list[dict[str, Any]]:
    """The default rendering (module docstring) as plain role/content messages."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            result = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "_tool_results": True})
            continue
        plain = {k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")}
        calls = history_calls(m, i)
        if calls:
            rendered = parser.render_calls(calls)
            plain["content"] = f"{m['content']}\n{rendered}" if m.get("content") else rendered
        out.append(plain)
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        section = tool_system_prompt(tools, parser)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out
