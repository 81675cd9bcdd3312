"""The backend contract the interpreter talks to, and the behaviour shared by all backends.

A backend implements three primitives over SGLang's native ``/generate`` shapes
(SGLang's ``GenerateReqInput``): :meth:`Backend.request` (a request body in, the
response dict or list out), :meth:`Backend.request_stream` (cumulative events of one streaming
request) and :meth:`Backend.get_model_info`. On top of them this class provides what programs need:
``complete`` / ``complete_stream`` for a gen, ``cache_prefix`` for fork and batch precaching, and
``select`` (scoring in :mod:`radixlm.lang.scoring`). Backends take plain data, never the interpreter.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, Iterator, Optional, Sequence, Union

from radixlm.lang import chat_template as ct
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.ir import GenParams


class BackendError(RuntimeError):
    """A request failed: an HTTP error status, an in-band stream error or an aborted request."""

    def __init__(self, message: str, status_code: Optional[int] = None):
        super().__init__(message if status_code is None else f"{status_code}: {message}")
        self.message = message
        self.status_code = status_code


def check_response(resp: dict) -> dict:
    """Raise BackendError for an aborted request (status 200 but finish_reason ``abort``)."""
    finish = (resp.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise BackendError(f"request aborted: {finish.get('message', '')}", finish.get("status_code"))
    return resp


class Backend(ABC):
    """Base of all backends.

    Args:
        chat_template: a :class:`ChatTemplate`, a registered name (``"chatml"``, ``"default"``) or
            ``None`` to derive it from :meth:`get_model_info` on first use of a role.
    """

    def __init__(self, chat_template: Union[ct.ChatTemplate, str, None] = None):
        self._chat_template = ct.get_template(chat_template) if isinstance(chat_template, str) else chat_template
        self._template_lock = threading.Lock()

    # ---- primitives ------------------------------------------------------------------------
    @abstractmethod
    def request(self, body: dict[str, Any]) -> Union[dict, list[dict]]:
        """Run one ``/generate`` body (``text`` or ``input_ids``, single or batch); raises BackendError."""

    @abstractmethod
    def request_stream(self, body: dict[str, Any]) -> Iterator[dict]:
        """Run one streaming ``/generate`` body; yields events whose ``text`` is cumulative."""

    @abstractmethod
    def get_model_info(self) -> dict[str, Any]:
        """The ``/get_model_info`` dict (``model_path``, ``tokenizer_path``, maybe ``chat_template``)."""

    def flush_cache(self) -> bool:
        """Drop the server's prefix cache; False when it refused (requests in flight)."""
        return False

    def shutdown(self) -> None:
        """Release resources (connections, in-process engines)."""

    # ---- shared behaviour ------------------------------------------------------------------
    def get_chat_template(self) -> ct.ChatTemplate:
        """The role markup, derived once (lazily: programs without roles never need it)."""
        with self._template_lock:
            if self._chat_template is None:
                self._chat_template = ct.from_model_info(self.get_model_info())
            return self._chat_template

    @staticmethod
    def _body(prompt: str, params: GenParams) -> dict[str, Any]:
        sampling, top = params.to_srt()
        return {"text": prompt, "sampling_params": sampling, **top}

    def complete(self, prompt: str, params: GenParams) -> tuple[Any, Any]:
        """Complete ``prompt``; returns ``(text, meta_info)``, or with ``params.n > 1`` the lists
        ``([text, ...], [meta_info, ...])`` of the n samples."""
        resp = self.request(self._body(prompt, params))
        if isinstance(resp, list):  # n > 1: one response per sample
            samples = [check_response(r) for r in resp]
            return [r["text"] for r in samples], [r["meta_info"] for r in samples]
        resp = check_response(resp)
        return resp["text"], resp["meta_info"]

    def complete_stream(self, prompt: str, params: GenParams) -> Iterator[tuple[str, Optional[dict]]]:
        """Stream a completion: yields ``(new_text, meta_info so far)`` per chunk, then
        ``("", meta_info)`` once.

        Raises:
            ValueError: ``params.n > 1`` (n samples do not stream as one text).
        """
        if (params.n or 1) > 1:
            raise ValueError(f"gen(n={params.n}) cannot stream: run the program with stream=False")
        emitted, meta = "", None
        for event in self.request_stream(self._body(prompt, params)):
            check_response(event)
            text, meta = event.get("text", ""), event.get("meta_info")
            if len(text) > len(emitted) and text.startswith(emitted):
                yield text[len(emitted):], meta
                emitted = text
        yield "", meta

    def cache_prefix(self, prompt: str) -> dict[str, Any]:
        """Prefill ``prompt`` into the radix cache without generating (``max_new_tokens: 0``)."""
        resp = self.request({"text": prompt, "sampling_params": {"max_new_tokens": 0, "temperature": 0}})
        return check_response(resp)["meta_info"]  # type: ignore[index,arg-type]

    def select(self, prompt: str, choices: Sequence[str],
               method: Optional[ChoicesSamplingMethod] = None) -> ChoicesDecision:
        """Score each choice as a continuation of ``prompt`` and decide with ``method``."""
        from radixlm.lang.scoring import score_choices

        return score_choices(self, prompt, list(choices), method or token_length_normalized)
