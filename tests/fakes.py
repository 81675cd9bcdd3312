"""Test doubles shared by several test packages."""

from __future__ import annotations

from radixlm.managers.tokenizer_manager import RequestError


class OverloadedTokenizerManager:
    """Stands in for the TokenizerManager of an HTTP app: tokenizes nothing, refuses every admission
    with 503 (so route handlers and error shapes can be tested without a scheduler)."""

    context_len = 2048
    dead = None
    draining = False

    def __init__(self, tokenizer):
        from radixlm.managers.prompt_tokenizer import PromptTokenizer

        self.tokenizer = tokenizer
        self.prompt_tokenizer = PromptTokenizer(tokenizer, self.context_len)

    async def prepare(self, req):
        return req

    def check_admission(self, prep):
        raise RequestError("The request queue is full; retry later", 503)
