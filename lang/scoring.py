"""Logprob scoring of ``select`` choices against a prefix, with the choice method deciding.

Requests (SGLang's contract, section 1.3 of the reference notes, with its gaps fixed):
1. ``prefix`` with ``max_new_tokens: 0``: caches it and tells its token count ``P``.
2. One batched logprob request over ``[prefix, prefix + c for c in choices]`` with
   ``logprob_start_len = max(P - HEAL_WINDOW, 0)``, so the last prefix tokens come back too. A
   choice whose first characters merge with the end of the prefix re-tokenizes those last tokens;
   comparing ids position by position with the bare prefix's entries (element 0 of the batch) finds
   where the choice's own tokens start. A merged (healed) token counts as the choice's first token.
3. Only for methods that need it: the choice tokens alone (``input_ids``, ``logprob_start_len: 0``),
   so the unconditional lists line up with the conditional ones by construction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, mean_logprob

if TYPE_CHECKING:
    from radixlm.lang.backend import Backend

HEAL_WINDOW = 2  # prefix tokens re-scored before the choices (SGLang uses 2 as well)
_NO_GEN = {"max_new_tokens": 0, "temperature": 0}


def split_choice_tokens(prefix_tail: list[list[Any]], entries: list[list[Any]]) -> list[list[Any]]:
    """Drop the leading entries of ``prefix + choice`` that are still the prefix's own tokens.

    Both lists start at the same token position; ``prefix_tail`` holds the bare prefix's last tokens.
    The first position whose token id differs (or that lies past the prefix) starts the choice.
    """
    k = 0
    while k < len(prefix_tail) and k < len(entries) and entries[k][1] == prefix_tail[k][1]:
        k += 1
    return [list(e) for e in entries[k:]]


def _without_context_token(choice: str, entries: list[list[Any]]) -> list[list[Any]]:
    """A choice scored with no text before it: the sequence's first token has no logprob. A token the
    tokenizer adds (BOS) is context and is dropped; a first token of the choice's own text cannot be
    scored, and averaging the rest would compare choices on different tokens (a one-token choice
    scored -inf and lost to any longer one).

    Raises:
        ValueError: the choice's own first token has nothing before it (the model adds no BOS).
    """
    if entries and entries[0][0] is None:
        text = entries[0][2] if len(entries[0]) > 2 else None
        if isinstance(text, str) and text.strip() and choice.lstrip().startswith(text.strip()):
            raise ValueError(f"select at the very start of a program cannot score choice {choice!r}: its first "
                             f"token has no text before it (this model adds no BOS token); put a prompt or a role "
                             f"before the select")
        return entries[1:]
    return entries


def score_choices(backend: "Backend", prefix: str, choices: list[str],
                  method: ChoicesSamplingMethod) -> ChoicesDecision:
    """Score ``choices`` after ``prefix`` and return the method's decision.

    ``decision.meta_info`` holds ``normalized_prompt_logprobs`` (per choice), ``input_token_logprobs``
    (the choice tokens' ``[logprob, id, text]``), ``output_token_logprobs`` (empty lists),
    ``unconditional_token_logprobs`` (or None), ``prompt_tokens`` (P), ``cached_tokens`` (per
    choice) and whatever the method adds.
    """
    if not choices:
        raise ValueError("select needs at least one choice")
    prompt_tokens = 0
    if prefix:
        prompt_tokens = backend.cache_prefix(prefix)["prompt_tokens"]
    start = max(prompt_tokens - HEAL_WINDOW, 0)
    texts = [prefix] + [prefix + c for c in choices] if prefix else list(choices)
    resps = backend.request({"text": texts, "sampling_params": _NO_GEN, "return_logprob": True,
                             "logprob_start_len": start, "return_text_in_logprobs": True})
    assert isinstance(resps, list)
    prefix_tail = resps[0]["meta_info"]["input_token_logprobs"] if prefix else []
    choice_resps = resps[1:] if prefix else resps
    input_lps = [split_choice_tokens(prefix_tail, r["meta_info"]["input_token_logprobs"]) for r in choice_resps]
    if not prefix:
        input_lps = [_without_context_token(choice, lps) for choice, lps in zip(choices, input_lps)]
    for choice, lps in zip(choices, input_lps):
        if not lps:
            raise ValueError(f"choice {choice!r} adds no token after the prefix")
    normalized = [mean_logprob(lps) for lps in input_lps]

    unconditional = None
    if method.requires_unconditional_logprobs:
        ids = [[int(t[1]) for t in lps] for lps in input_lps]
        uresps = backend.request({"input_ids": ids, "sampling_params": _NO_GEN, "return_logprob": True,
                                  "logprob_start_len": 0, "return_text_in_logprobs": True})
        assert isinstance(uresps, list)
        unconditional = [r["meta_info"]["input_token_logprobs"] for r in uresps]

    decision = method(choices=choices, normalized_prompt_logprobs=normalized, input_token_logprobs=input_lps,
                      output_token_logprobs=[[] for _ in choices], unconditional_token_logprobs=unconditional)
    decision.meta_info = {
        "normalized_prompt_logprobs": normalized,
        "input_token_logprobs": input_lps,
        "output_token_logprobs": [[] for _ in choices],
        "unconditional_token_logprobs": unconditional,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": [r["meta_info"].get("cached_tokens") for r in choice_resps],
        "choices_method": repr(method),
        **(decision.meta_info or {}),  # a custom method may leave it None, as SGLang's default is
    }
    return decision
