"""The verbs of the language: ``function``, ``gen``, ``select``, roles, and backend helpers."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

from radixlm.lang import ir
from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.defaults import resolve_backend
from radixlm.lang.program import Program


def function(func: Optional[Callable[..., Any]] = None, **options: Any) -> Any:
    """Decorator turning ``def prog(s, ...)`` into a :class:`Program` (``@function`` or ``@function()``).

    ``options`` is accepted for SGLang compatibility (``num_api_spec_tokens``) and ignored.
    """
    if func is None:
        return lambda f: Program(f)
    return Program(func)


def gen(
    name: Optional[str] = None,
    max_tokens: Optional[int] = None,
    min_tokens: Optional[int] = None,
    n: Optional[int] = None,
    stop: Optional[Union[str, Sequence[str]]] = None,
    stop_token_ids: Optional[Sequence[int]] = None,
    stop_regex: Optional[Union[str, Sequence[str]]] = None,
    temperature: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    ignore_eos: Optional[bool] = None,
    return_logprob: Optional[bool] = None,
    logprob_start_len: Optional[int] = None,
    top_logprobs_num: Optional[int] = None,
    return_text_in_logprobs: Optional[bool] = None,
    dtype: Optional[Union[type, str]] = None,
    choices: Optional[Sequence[str]] = None,
    choices_method: Optional[ChoicesSamplingMethod] = None,
    regex: Optional[str] = None,
    json_schema: Optional[Union[str, dict]] = None,
    sampling_seed: Optional[int] = None,
) -> ir.Expr:
    """Generate text into variable ``name``.

    Every argument left ``None`` inherits the run-level default (``program.run(temperature=0, ...)``),
    whose own defaults are ``max_new_tokens=128, temperature=1.0, top_p=1.0, top_k=-1``.
    ``dtype`` (int, float, bool, str) constrains the output with a regex (and, for numbers, stops
    at a space or newline); it wins over ``regex``. ``choices`` makes this a :func:`select`.
    ``regex`` and ``stop_regex`` are compiled here, so a bad pattern fails before anything is sent.
    ``n > 1`` samples n completions of the same text (not streamed): the variable holds the list of
    them, its meta info the list of their ``meta_info``, and the program text continues with the
    first, as in SGLang.

    Raises:
        re.error: ``regex`` or a ``stop_regex`` does not compile.
        ValueError: ``n`` below 1.
    """
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0, choices_method=choices_method)
    ir.validate_regex(regex)
    for pattern in [stop_regex] if isinstance(stop_regex, str) else (stop_regex or ()):
        ir.validate_regex(pattern)
    if n is not None and n < 1:
        raise ValueError(f"gen(n={n}): n must be at least 1")
    params = ir.GenParams.from_kwargs(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids,
        stop_regex=stop_regex,
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty, ignore_eos=ignore_eos, return_logprob=return_logprob,
        logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs, dtype=dtype, regex=regex, json_schema=json_schema,
        sampling_seed=sampling_seed,
    )
    return ir.Gen(name, params)


def gen_int(name: Optional[str] = None, **kwargs: Any) -> ir.Expr:
    """``gen(name, dtype=int, ...)``: digits only; the variable holds the text (``int(s[name])`` parses)."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: Optional[str] = None, **kwargs: Any) -> ir.Expr:
    """``gen(name, dtype=str, ...)``: a double-quoted string of word characters and spaces."""
    return gen(name, dtype=str, **kwargs)


def select(name: Optional[str] = None, choices: Optional[Sequence[str]] = None, temperature: float = 0.0,
           choices_method: Optional[ChoicesSamplingMethod] = None) -> ir.Expr:
    """Append the choice the model scores best after the current text; store it in ``name``.

    Scoring is by token logprobs (always greedy); ``choices_method`` is one of
    ``token_length_normalized`` (default), ``greedy_token_selection``,
    ``unconditional_likelihood_normalized``. The meta info holds the per-choice scores.
    """
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    if temperature > 1e-5:
        raise ValueError("select scores choices greedily; temperature must be 0")
    return ir.Select(name, tuple(str(c) for c in choices), temperature,
                     choices_method or token_length_normalized)


def _role(role: str, expr: Any) -> ir.Expr:
    """A whole turn; with no content an empty one, as SGLang's (the block form is ``with s.user():``)."""
    content = [] if expr is None else ir.walk(ir.to_expr(expr))
    return ir.ExprList([ir.RoleBegin(role), *content, ir.RoleEnd(role)])


def system(expr: Any = None) -> ir.Expr:
    """A system turn: ``s += system("You are ...")``."""
    return _role("system", expr)


def user(expr: Any = None) -> ir.Expr:
    """A user turn: ``s += user("question")``."""
    return _role("user", expr)


def assistant(expr: Any = None) -> ir.Expr:
    """An assistant turn: ``s += assistant(gen("answer", max_tokens=64))``."""
    return _role("assistant", expr)


def system_begin() -> ir.Expr:
    return ir.RoleBegin("system")


def system_end() -> ir.Expr:
    return ir.RoleEnd("system")


def user_begin() -> ir.Expr:
    return ir.RoleBegin("user")


def user_end() -> ir.Expr:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.Expr:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.Expr:
    return ir.RoleEnd("assistant")


def flush_cache(backend: Any = None, empty_cache: bool = True) -> bool:
    """Flush the (default) backend's prefix cache; False when the server refused (requests in flight).

    ``empty_cache`` is SGLang's (it also returns freed CUDA memory to the driver there); the KV pools
    here stay allocated either way, so it changes nothing.
    """
    del empty_cache
    return resolve_backend(backend).flush_cache()


def separate_reasoning(expr: Any = None, model_type: Optional[str] = None) -> ir.Expr:
    """``expr`` (a gen or select, or a list holding some), then split each named one's output into the
    answer and the reasoning by the tags of reasoning parser ``model_type`` (SGLang's
    ``separate_reasoning``; the names of ``--reasoning-parser``: ``deepseek-r1``, ``qwen3``, ...).

    After it, variable ``x`` holds the answer and ``x_reasoning_content`` the reasoning ("" when there
    was none), and the program text keeps only the answer where ``x``'s output was (a streamed
    program's text keeps what it streamed).

    Raises:
        ValueError: ``model_type`` is not a known reasoning parser, or ``expr`` has no named gen/select.
    """
    from radixlm.srt.reasoning_parser import get_reasoning_format

    if model_type is None:
        raise ValueError("separate_reasoning needs model_type, a reasoning parser name such as 'deepseek-r1'")
    get_reasoning_format(model_type)
    if expr is None:
        return ir.ExprList([])
    nodes = ir.walk(ir.to_expr(expr))
    names = [n.name for n in nodes if isinstance(n, (ir.Gen, ir.Select)) and n.name is not None]
    if not names:
        raise ValueError("separate_reasoning needs a named gen or select (gen('answer', ...))")
    # The last output first: splitting it does not move the text of the ones before it.
    return ir.ExprList([*nodes, *(ir.SeparateReasoning(name, model_type) for name in reversed(names))])


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """``/get_server_info`` of the (default) backend, when it has one."""
    b = resolve_backend(backend)
    getter = getattr(b, "get_server_info", None)
    return getter() if getter else {}
