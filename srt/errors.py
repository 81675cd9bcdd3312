"""Error bodies of the HTTP API: one HTTP-status -> ``type`` table for both error shapes.

- Native routes (SGLang's ``/generate``, ``/health``, ``/flush_cache``, ...): ``{"error": {"message":
  str, "type": str, "code": int}}``. SGLang's clients read ``error.message`` (its native body is
  ``{"error": {"message"}}``); ``type`` and ``code`` (the HTTP status) are additions, so a client can
  tell the cases apart without matching message text. In-band errors of ``/generate`` streams use
  the same object.
- OpenAI routes (``/v1/*``): ``{"error": {"message", "type", "param", "code"}}`` with the same ``type``
  values (``radixlm.srt.openai_api.protocol.openai_error_body``).

Stdlib only, so every layer (HTTP app, tokenizer manager, OpenAI router) can import it.
"""

from __future__ import annotations

# OpenAI's vocabulary; a status not listed is ``server_error`` (5xx) or ``invalid_request_error``.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               422: "invalid_request_error", 499: "client_closed_request", 503: "service_unavailable_error"}


def error_type(status: int) -> str:
    """The ``type`` of an error answered with HTTP ``status``."""
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def native_error_body(message: str, status: int) -> dict:
    """The native routes' error object for an HTTP ``status`` (an int, also sent as ``code``)."""
    return {"error": {"message": message, "type": error_type(status), "code": status}}
