"""Choice methods for ``select``: decide among options from their token logprobs.

Each method is a callable ``method(choices=..., normalized_prompt_logprobs=..., input_token_logprobs=...,
output_token_logprobs=..., unconditional_token_logprobs=None) -> ChoicesDecision``. Token logprobs are
per choice lists of ``[logprob | None, token_id, text | None]`` covering the choice's own tokens
(the prefix tokens are already dropped; a token merged across the prefix/choice boundary is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

TokenLogprobs = Sequence[Sequence[Any]]


@dataclass
class ChoicesDecision:
    """The chosen option and the method's diagnostics (they end up in the select's meta info)."""

    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


class ChoicesSamplingMethod:
    """Base class; subclasses implement ``__call__``. ``requires_unconditional_logprobs`` asks the
    backend for a third request scoring each choice on its own."""

    requires_unconditional_logprobs = False

    def __call__(self, *, choices: Sequence[str], normalized_prompt_logprobs: Sequence[float],
                 input_token_logprobs: Sequence[TokenLogprobs], output_token_logprobs: Sequence[TokenLogprobs],
                 unconditional_token_logprobs: Optional[Sequence[TokenLogprobs]] = None) -> ChoicesDecision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__


def _values(token_logprobs: TokenLogprobs) -> list[float]:
    return [float(t[0]) for t in token_logprobs if t[0] is not None]


def mean_logprob(token_logprobs: TokenLogprobs) -> float:
    """Mean of the non-null logprobs (``-inf`` for a choice with none)."""
    vals = _values(token_logprobs)
    return sum(vals) / len(vals) if vals else float("-inf")


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob (SGLang's default)."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        best = _argmax(normalized_prompt_logprobs)
        return ChoicesDecision(choices[best])


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token: keep those tying the best logprob at each position.

    Shorter choices are padded with their own mean logprob; among the survivors after the last
    position the first one wins. ``meta_info["greedy_logprob_matrix"]`` is the padded matrix.
    """

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        rows = [_values(t) for t in input_token_logprobs]
        width = max((len(r) for r in rows), default=0)
        matrix = [r + [mean_logprob(t)] * (width - len(r)) for r, t in zip(rows, input_token_logprobs)]
        alive = list(range(len(choices)))
        for col in range(width):
            top = max(matrix[i][col] for i in alive)
            alive = [i for i in alive if matrix[i][col] == top]
            if len(alive) == 1:
                break
        return ChoicesDecision(choices[alive[0]], {"greedy_logprob_matrix": matrix})


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The choice whose tokens gain the most from the prompt: argmax of mean(conditional - unconditional).

    The unconditional lists score each choice's tokens with no prompt; their first entry has no
    logprob (``None``, counted as 0). ``meta_info["normalized_unconditional_prompt_logprobs"]`` holds
    the per-choice means.
    """

    requires_unconditional_logprobs = True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional_token_logprobs")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(cond) != len(uncond):
                raise ValueError(f"conditional ({len(cond)}) and unconditional ({len(uncond)}) token "
                                 "logprobs do not line up")
            diffs = [(c[0] or 0.0) - (u[0] or 0.0) for c, u in zip(cond, uncond)]
            scores.append(sum(diffs) / len(diffs) if diffs else float("-inf"))
        best = _argmax(scores)
        return ChoicesDecision(choices[best], {"normalized_unconditional_prompt_logprobs": scores})


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
