"""Chat templates as role prefixes/suffixes, derived from a model's Jinja template.

A program's roles are rendered piecewise (``with s.user(): ...`` appends the user prefix, the body,
then the suffix), so a Jinja template is reduced once to a :class:`ChatTemplate` by rendering probe
conversations and splitting at marker strings. Sources, in order: an explicit template, the server's
``/get_model_info`` ``chat_template`` field, the tokenizer's template (loaded lazily with
transformers from ``tokenizer_path``), else the plain ``default`` template.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
_MARK = {"system": "\x01SYS\x01", "user": "\x01USR\x01", "assistant": "\x01AST\x01"}

Render = Callable[[list[dict[str, str]], bool], str]


@dataclass(frozen=True)
class ChatTemplate:
    """Role markup of one model.

    ``roles[role] = (prefix, suffix)``; ``default_system_prompt`` is inserted as a system turn when a
    program's first role is not ``system``; ``stop_str`` ends every gen inside an assistant turn.
    """

    name: str
    roles: dict[str, tuple[str, str]] = field(default_factory=dict)
    default_system_prompt: Optional[str] = None
    stop_str: Optional[str] = None

    def prefix(self, role: str) -> str:
        return self.roles[role][0]

    def suffix(self, role: str) -> str:
        return self.roles[role][1]


DEFAULT = ChatTemplate("default", {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"),
                                   "assistant": ("ASSISTANT:", "\n")})
CHATML = ChatTemplate("chatml", {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ROLES}, stop_str="<|im_end|>")
REGISTRY = {t.name: t for t in (DEFAULT, CHATML)}


def get_template(name: str) -> ChatTemplate:
    """A registered template by name (``default``, ``chatml``)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown chat template {name!r}; known: {', '.join(REGISTRY)}") from None


def _split(text: str, mark: str, where: str) -> tuple[str, str]:
    if text.count(mark) != 1:
        raise ValueError(f"cannot find the {where} content in the rendered template")
    before, after = text.split(mark)
    return before, after


def derive(render: Render, name: str = "model", bos_token: Optional[str] = None) -> ChatTemplate:
    """Reduce a renderer ``render(messages, add_generation_prompt) -> str`` to a ChatTemplate.

    ``bos_token``, when given, is stripped from the start of renders: the server's tokenizer adds
    it itself, so keeping it would double it.

    Raises:
        ValueError: the template does not render roles as contiguous prefix + content + suffix.
    """
    def r(msgs: list[tuple[str, str]], gen: bool = False) -> str:
        out = render([{"role": role, "content": _MARK[content]} for role, content in msgs], gen)
        return out[len(bos_token):] if bos_token and out.startswith(bos_token) else out

    roles: dict[str, tuple[str, str]] = {}
    try:
        base = r([("system", "system")])
        roles["system"] = _split(base, _MARK["system"], "system")
        head = [("system", "system")]
    except Exception:  # templates that refuse a system turn: fold it into a user turn
        base, head = "", []
    with_user = r([*head, ("user", "user")])
    if not with_user.startswith(base):
        raise ValueError("the template renders earlier turns differently once a user turn follows")
    roles["user"] = _split(with_user[len(base):], _MARK["user"], "user")
    with_asst = r([*head, ("user", "user"), ("assistant", "assistant")])
    asst_prefix, asst_suffix = _split(with_asst[len(with_user):], _MARK["assistant"], "assistant")
    # The generation prompt is what the model was trained to answer after; prefer it as the prefix.
    gen_prompt = r([*head, ("user", "user")], True)[len(with_user):]
    roles["assistant"] = (gen_prompt or asst_prefix, asst_suffix)
    roles.setdefault("system", roles["user"])

    default_system = None
    lone_user = r([("user", "user")])
    start = lone_user.find(roles["user"][0] + _MARK["user"])
    sys_prefix, sys_suffix = roles["system"]
    if start > 0 and head:
        before = lone_user[:start]
        if before.startswith(sys_prefix) and before.endswith(sys_suffix):
            default_system = before[len(sys_prefix):len(before) - len(sys_suffix)]
    stop = asst_suffix.strip() or None
    return ChatTemplate(name, roles, default_system, stop)


def jinja_renderer(source: str, special: Optional[dict[str, Any]] = None) -> Render:
    """A renderer over a Jinja chat template string, set up the way transformers renders them."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)
    extra = dict(special or {})

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)

    return render


def from_model_info(model_info: dict[str, Any]) -> ChatTemplate:
    """The template for a server: its ``chat_template`` field, else its tokenizer's, else ``default``."""
    name = str(model_info.get("model_path") or "model")
    source = model_info.get("chat_template")
    if isinstance(source, str) and source:
        return derive(jinja_renderer(source, {"bos_token": "", "eos_token": ""}), name)
    path = model_info.get("tokenizer_path") or model_info.get("model_path")
    if path:
        try:
            return from_tokenizer_path(str(path))
        except Exception as exc:  # no tokenizer here (remote server) or no template: plain roles
            logger.info("no chat template from %s (%s); using the default role markup", path, exc)
    return DEFAULT


def from_tokenizer_path(path: str) -> ChatTemplate:
    """The template of the tokenizer at ``path``: read from a local folder's files when they hold
    it, else by loading the tokenizer with transformers (imported here; seconds)."""
    local = _from_local_files(path)
    if local is not None:
        return local
    from transformers import AutoTokenizer

    return from_tokenizer(AutoTokenizer.from_pretrained(path), path)


def _from_local_files(path: str) -> Optional[ChatTemplate]:
    """``chat_template.jinja`` or ``tokenizer_config.json["chat_template"]`` of a folder, or None."""
    import json
    import os

    config_path = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    source = config.get("chat_template")
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            source = f.read()
    if isinstance(source, list):  # named templates: use "default"
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not source:
        return DEFAULT
    special = {k: _token_str(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    bos = special["bos_token"]
    return derive(jinja_renderer(source, special), path, bos if bos and _adds_bos(path, config, bos) else None)


def _token_str(token: Any) -> str:
    return token.get("content", "") if isinstance(token, dict) else (token or "")


def _adds_bos(path: str, config: dict[str, Any], bos: str) -> bool:
    """Whether the tokenizer prepends BOS itself (then a template's leading BOS must go)."""
    import json
    import os

    if config.get("add_bos_token") is not None:
        return bool(config["add_bos_token"])
    tok_path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tok_path):
        return False
    with open(tok_path, encoding="utf-8") as f:
        post = json.load(f).get("post_processor") or {}
    return bos in json.dumps(post)


def from_tokenizer(tokenizer: Any, name: str = "model") -> ChatTemplate:
    """Derive from a loaded HF tokenizer; ``default`` when it has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return DEFAULT

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    bos = getattr(tokenizer, "bos_token", None)
    adds_bos = bool(bos) and tokenizer.bos_token_id in tokenizer("x").input_ids[:1]
    return derive(render, name, bos if adds_bos else None)
