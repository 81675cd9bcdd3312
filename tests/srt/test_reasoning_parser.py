"""Reasoning parsers: the split of ``<think>`` ... ``</think>`` output into reasoning and content,
identical at every chunk boundary (tags split anywhere, ``<th`` + ``ink>``)."""

from __future__ import annotations

import pytest

from radixlm.srt.reasoning_parser import (REASONING_PARSERS, ReasoningStream, get_reasoning_format,
                                          starts_in_reasoning)


def split(name: str, inside: bool, text: str, cuts: list[int]) -> tuple[str, str]:
    s = ReasoningStream(get_reasoning_format(name), inside)
    reasoning = content = ""
    bounds = [0, *cuts, len(text)]
    for a, b in zip(bounds, bounds[1:]):
        r, c = s.feed(text[a:b])
        reasoning, content = reasoning + r, content + c
    r, c = s.finish()
    assert (reasoning + r, content + c) == (s.reasoning, s.content)
    return s.reasoning, s.content


CASES = [
    ("qwen3", False, "<think>\nI think.\n</think>\n\nThe answer.", "\nI think.\n", "The answer."),
    ("qwen3", False, "  <think>a</think>b", "a", "b"),
    ("qwen3", True, "I think </th not yet</think>\n\nAns", "I think </th not yet", "Ans"),
    ("qwen3", False, "Just answer <think> inline", "", "Just answer <think> inline"),
    ("qwen3", False, "<thin", "", "<thin"),
    ("deepseek-r1", False, "<think>abc</think>def", "abc", "def"),  # forced: starts inside anyway
    ("deepseek-r1", True, "no end tag <", "no end tag <", ""),
    ("deepseek-r1", True, "</think>", "", ""),
    ("kimi", False, "◁think▷思考◁/think▷答え", "思考", "答え"),
]


@pytest.mark.parametrize("name,inside,text,reasoning,content", CASES)
def test_split_is_the_same_at_every_pair_of_cuts(name, inside, text, reasoning, content) -> None:
    inside = inside or get_reasoning_format(name).force
    assert split(name, inside, text, []) == (reasoning, content)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert split(name, inside, text, [i, j]) == (reasoning, content), (i, j)


def test_where_the_output_starts() -> None:
    qwen3, r1 = get_reasoning_format("qwen3"), get_reasoning_format("deepseek-r1")
    assert starts_in_reasoning(qwen3, "<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning(qwen3, "<|im_start|>assistant\n")
    assert not starts_in_reasoning(qwen3, "<think>\nold</think>\nanswer<|im_start|>assistant\n")
    assert starts_in_reasoning(r1, "<|Assistant|>")


def test_a_tag_split_over_chunks_is_held_back() -> None:
    s = ReasoningStream(get_reasoning_format("qwen3"), True)
    assert s.feed("abc </th") == ("abc ", "")
    assert s.feed("ank> x") == ("</thank> x", "")  # not the end tag: released once known
    assert s.feed(" </") == (" ", "")
    assert s.feed("think>\n") == ("", "")  # the end tag, and whitespace that is not content
    assert s.feed("ok") == ("", "ok")
    assert s.finish() == ("", "")
    assert (s.reasoning, s.content) == ("abc </thank> x ", "ok")


def test_unknown_name_lists_the_known() -> None:
    with pytest.raises(ValueError, match=", ".join(REASONING_PARSERS)):
        get_reasoning_format("nope")
