"""Chat messages -> prompt text and token ids, with the tokenizer's chat template.

``ChatTemplate(tokenizer, path)`` reads the ``--chat-template`` Jinja file once (a missing file is
an error at startup); otherwise the tokenizer's own template is used. ``render`` applies it with
transformers' ``apply_chat_template`` and tokenizes the result without adding special tokens (the
template writes BOS itself if the model wants one), as ``apply_chat_template(tokenize=True)`` does.
Tools and tool-use history go through the template when it knows tools, else through radixlm's
default rendering (``tool_prompt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from radixlm.srt.openai_api.protocol import ChatMessage, OpenAIError
from radixlm.srt.openai_api.tool_prompt import default_messages, native_messages, template_supports_tools

# "developer" is OpenAI's newer name for the system role; templates only know "system".
_ROLE_ALIASES = {"developer": "system"}


class ChatTemplate:
    """The chat template of one server: the ``--chat-template`` file or the tokenizer's own."""

    def __init__(self, tokenizer: Any, path: Optional[str] = None):
        self.tokenizer = tokenizer
        self.source = path
        self.template: Optional[str] = None
        if path:
            file = Path(path).expanduser()
            if not file.is_file():
                raise FileNotFoundError(f"--chat-template {path}: no such file")
            self.template = file.read_text(encoding="utf-8")
        elif getattr(tokenizer, "chat_template", None):
            self.template = None  # apply_chat_template uses the tokenizer's own
            self.source = "tokenizer"

    @property
    def available(self) -> bool:
        return self.source is not None

    @property
    def text(self) -> Optional[str]:
        """The Jinja source in use (a tokenizer's named templates: its ``default`` one)."""
        if self.template is not None:
            return self.template
        own = getattr(self.tokenizer, "chat_template", None)
        if isinstance(own, dict):
            own = own.get("default") or next(iter(own.values()), None)
        return own if isinstance(own, str) else None

    @property
    def supports_tools(self) -> bool:
        """The template renders ``tools`` itself (else the default tool rendering applies)."""
        return template_supports_tools(self.text)

    def render(self, messages: list[ChatMessage], continue_final_message: Optional[bool] = None,
               template_kwargs: Optional[dict[str, Any]] = None) -> tuple[str, list[int]]:
        """Return ``(prompt_text, prompt_ids)``: ``render_text`` then tokenizing (no special tokens
        added: the template writes them). Raises as ``render_text``."""
        text = self.render_text(messages, continue_final_message, template_kwargs)
        return text, list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_text(self, messages: list[ChatMessage], continue_final_message: Optional[bool] = None,
                    template_kwargs: Optional[dict[str, Any]] = None, tools: Optional[list[Any]] = None,
                    tool_parser: Any = None, add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (the server tokenizes it off the event loop when large).

        Args:
            continue_final_message: continue the last (assistant) message instead of opening a new
                assistant turn; ``None`` means no, as in vLLM, SGLang and OpenAI (a final assistant
                message is history and the reply is a new turn).
            template_kwargs: extra variables for the template (``chat_template_kwargs``).
            tools: ``FunctionTool`` list the prompt offers (None/empty: none).
            tool_parser: the ``ToolCallParser`` whose format the default rendering writes (needed
                for tools or tool-use history with a template that does not know tools).
            add_generation_prompt: open the assistant's turn (vLLM's field; default true); false
                renders the conversation as it is (no effect when continuing the final message).

        Raises:
            OpenAIError(400): no template, a non-text content part, a message without content or (role
                tool) without ``tool_call_id``, a bad prefill request, or a template that fails to render.
        """
        if not self.available:
            raise OpenAIError("This model has no chat template, so /v1/chat/completions cannot format "
                              "messages; start the server with --chat-template FILE (a Jinja template) "
                              "or use /v1/completions", 400, "messages", "chat_template_missing")
        plain = [_plain_message(m, i) for i, m in enumerate(messages)]
        kwargs = dict(template_kwargs or {})
        has_history = any(m.get("tool_calls") or m["role"] == "tool" for m in plain)
        if self.supports_tools:
            plain = native_messages(plain)
            if tools:
                kwargs["tools"] = [t.to_openai() for t in tools]
        elif (tools or has_history) and tool_parser is not None:
            plain = default_messages(plain, list(tools or []), tool_parser)
        last_is_assistant = plain[-1]["role"] == "assistant"
        cont = bool(continue_final_message)
        if cont and not last_is_assistant:
            raise OpenAIError("continue_final_message needs the last message to be from the assistant",
                              400, "continue_final_message")
        if cont and not plain[-1]["content"]:
            raise OpenAIError("continue_final_message needs a non-empty final assistant message",
                              400, "messages")
        for reserved in ("conversation", "tokenize", "chat_template", "add_generation_prompt",
                         "continue_final_message"):
            kwargs.pop(reserved, None)
        try:
            text = self.tokenizer.apply_chat_template(
                plain, chat_template=self.template, tokenize=False,
                add_generation_prompt=add_generation_prompt and not cont,
                continue_final_message=cont, **kwargs)
        except OpenAIError:
            raise
        except Exception as e:  # jinja errors, raise_exception() in templates, prefill not found
            raise OpenAIError(f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                              400, "messages") from None
        if not isinstance(text, str):  # some versions return a list for batched input
            text = text[0]
        return text


def _plain_message(m: ChatMessage, i: int) -> dict[str, Any]:
    """A template-ready dict: role (aliases resolved), content as one string, optional fields kept."""
    content = m.content
    if isinstance(content, list):
        if not content:  # OpenAI: "array too short" (a string, even empty, is the way to send no text)
            raise OpenAIError(f"messages.{i}.content: an array of content parts needs at least one part", 400,
                              f"messages.{i}.content")
        texts = []
        for j, part in enumerate(content):
            if part.type != "text":
                raise OpenAIError(f"messages.{i}.content.{j}: only text content parts are supported, got "
                                  f"type {part.type!r}", 400, f"messages.{i}.content.{j}.type")
            if not isinstance(part.text, str):
                raise OpenAIError(f"messages.{i}.content.{j}.text: a text part needs its text (a string)", 400,
                                  f"messages.{i}.content.{j}.text")
            texts.append(part.text)
        content = "".join(texts)
    if content is None and m.role != "assistant":
        raise OpenAIError(f"messages.{i}.content: a {m.role} message needs content", 400, f"messages.{i}.content")
    if m.role == "tool" and m.tool_call_id is None:  # OpenAI's check: the call a result answers must be named
        raise OpenAIError(f"Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id' "
                          f"(the id of the assistant's tool call it answers), but messages.{i} has none", 400,
                          f"messages.{i}.tool_call_id")
    out: dict[str, Any] = {"role": _ROLE_ALIASES.get(m.role, m.role), "content": content or ""}
    for key in ("name", "tool_call_id", "tool_calls"):
        value = getattr(m, key)
        if value is not None:
            out[key] = value
    return out
