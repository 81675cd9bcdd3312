"""An in-memory backend for interpreter tests: a character-level "model" with scripted replies.

Token ids are ``ord(c)`` (one per character) after a BOS of id 1, so ``prompt_tokens`` is
``len(text) + 1`` (``bos=False``: no BOS, as GPT-2-style tokenizers). A gen's reply is the first
``replies`` entry whose key the prompt ends with (else ``default``; a list of replies gives sample j
of an ``n > 1`` request the j-th), cut at ``max_new_tokens`` characters and at the first stop
string. A token's logprob is ``scores.get(char, -1.0)``. A prompt containing ``"FAIL"`` gets a 400.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator, Optional

from radixlm.lang.backend import Backend, BackendError
from radixlm.lang.chat_template import ChatTemplate

BOS = 1


class FakeBackend(Backend):
    def __init__(self, replies: Optional[dict[str, str]] = None, default: str = "ok",
                 scores: Optional[dict[str, float]] = None, chat_template: Any = "default",
                 stream_delay_s: float = 0.0, bos: bool = True):
        super().__init__(chat_template)
        self.bos = bos
        self.stream_delay_s = stream_delay_s
        self.replies = dict(replies or {})
        self.default = default
        self.scores = dict(scores or {})
        self.bodies: list[dict] = []
        self.cached: list[str] = []
        self.lock = threading.Lock()

    def _reply(self, prompt: str, sp: dict, sample: int = 0) -> str:
        reply = next((r for k, r in self.replies.items() if prompt.endswith(k)), self.default)
        if isinstance(reply, list):  # one reply per sample of an n > 1 request
            reply = reply[sample]
        reply = reply[: sp.get("max_new_tokens", 128)]
        for stop in sp.get("stop") or []:
            if stop in reply:
                reply = reply[: reply.index(stop)]
        return reply

    def _one(self, prompt: Any, body: dict, sample: int = 0) -> dict:
        if isinstance(prompt, str) and "FAIL" in prompt:
            raise BackendError("prompt contains FAIL", 400)
        ids = [BOS] * self.bos + [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)
        sp = body.get("sampling_params") or {}
        meta: dict[str, Any] = {"prompt_tokens": len(ids), "cached_tokens": 0,
                                "finish_reason": {"type": "length"}}
        text = "" if sp.get("max_new_tokens") == 0 else self._reply(prompt, sp, sample)
        if sp.get("max_new_tokens") == 0 and isinstance(prompt, str):
            with self.lock:
                self.cached.append(prompt)
        if body.get("return_logprob"):
            start = max(body.get("logprob_start_len", -1), 0)
            meta["input_token_logprobs"] = [
                [None if i == 0 else self.scores.get(chr(t) if t > 1 else "", -1.0), t, chr(t) if t > 1 else None]
                for i, t in enumerate(ids)][start:]
        return {"text": text, "output_ids": [ord(c) for c in text], "meta_info": meta}

    def request(self, body: dict) -> Any:
        with self.lock:
            self.bodies.append(body)
        key = "text" if body.get("text") is not None else "input_ids"
        prompt = body[key]
        batch = isinstance(prompt, list) and (key == "text" or (prompt and isinstance(prompt[0], list)))
        if batch:
            return [self._one(p, body) for p in prompt]
        n = (body.get("sampling_params") or {}).get("n", 1)
        return [self._one(prompt, body, j) for j in range(n)] if n > 1 else self._one(prompt, body)

    def request_stream(self, body: dict) -> Iterator[dict]:
        final = self.request(body)
        for i in range(1, len(final["text"]) + 1):
            time.sleep(self.stream_delay_s)
            yield {"text": final["text"][:i], "meta_info": {"finish_reason": None}}
        yield final

    def get_model_info(self) -> dict:
        return {"model_path": "fake"}


CHATML: ChatTemplate = ChatTemplate(
    "chatml-test", {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")},
    default_system_prompt="You are a test.", stop_str="<|im_end|>")
