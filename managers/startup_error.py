"""How a child process (scheduler, detokenizer) reports a failure before it is ready.

The launcher prints the child's reason as one line (``radixlm: error: <name> process failed to
start: <reason>``), so the reason sent over the ready pipe is one line too. Expected failures (a
corrupt or missing model, a bad option, no memory, no device) keep their traceback out of the way:
it is logged at DEBUG (``--log-level debug``). Anything else is a bug, whose traceback is logged at
ERROR.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

# ModelLoadError is a RuntimeError; ServerArgsError, GrammarError and SamplingParamsError are
# ValueErrors; a checkpoint without a parameter raises KeyError.
EXPECTED_STARTUP_ERRORS = (ValueError, RuntimeError, OSError, KeyError, ImportError, MemoryError)


def one_line_reason(exc: BaseException) -> str:
    """``str(exc)`` on one line (whitespace runs collapsed); prefixed by the exception's type name
    when the error is not an expected one, or has no message."""
    text = " ".join(str(exc).split())
    if not text or not isinstance(exc, EXPECTED_STARTUP_ERRORS):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def report_startup_failure(logger: logging.Logger, name: str, exc: BaseException, ready_pipe: Optional[Any]) -> None:
    """Log ``exc`` (traceback at DEBUG if expected, else at ERROR) and send ``"error: <one line>"``
    to the launcher. A launcher that is already gone is ignored (the log has the error)."""
    reason = one_line_reason(exc)
    if isinstance(exc, EXPECTED_STARTUP_ERRORS):
        logger.debug("%s process failed to start", name, exc_info=exc)
    else:
        logger.error("%s process failed to start: %s", name, reason, exc_info=exc)
    if ready_pipe is not None:
        try:
            ready_pipe.send(f"error: {reason}")
        except OSError:
            pass
