"""Read-only routes answer ``GET`` and ``HEAD``: the decorator both the native app and the ``/v1``
router declare them with.

Load balancers, uptime checkers and ``curl -I`` probe with ``HEAD``. Starlette adds ``HEAD`` to every
plain ``GET`` route, but FastAPI's routes take exactly the methods they are given, so without this a
``HEAD`` was a 405. The handler runs as for ``GET``; uvicorn sends its status and headers
(``Content-Length`` included) and drops the body, as HTTP requires. ``openapi_spec.get_and_head``
declares such a route's two operations.
"""

from __future__ import annotations

from typing import Any, Callable, Union

from fastapi import APIRouter, FastAPI

READ_METHODS = ("GET", "HEAD")


def read_route(router: Union[FastAPI, APIRouter], path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator registering a read-only handler for ``GET`` and ``HEAD`` on ``path``; it returns
    the handler unchanged, so several paths (aliases) can be stacked on one handler."""
    return router.api_route(path, methods=list(READ_METHODS))
