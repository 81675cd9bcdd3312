"""``RuntimeEndpoint``: a backend over a running server's native HTTP API.

Speaks SGLang's wire contract (SGLang's ``RuntimeEndpoint`` and ``/generate``): the whole
program text is re-sent on every gen and the server's radix cache does the reuse; streaming reads
``data:`` lines with cumulative ``text`` until ``data: [DONE]``. One pooled ``httpx.Client`` is
shared by all program threads.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional, Union

from radixlm.lang.backend import Backend, BackendError
from radixlm.lang.chat_template import ChatTemplate


class RuntimeEndpoint(Backend):
    """Backend for ``radixlm serve`` (or any server with SGLang's native ``/generate``).

    Args:
        base_url: e.g. ``"http://127.0.0.1:30000"``.
        api_key: sent as ``Authorization: Bearer <api_key>``.
        verify: TLS verification (httpx ``verify``), default on.
        chat_template: override the template derived from the server (a name or a ChatTemplate).
        timeout_s: per-request read timeout; ``None`` waits as long as a generation takes.

    Raises:
        BackendError: the server does not answer ``GET /get_model_info``.
    """

    def __init__(self, base_url: str, api_key: Optional[str] = None, verify: Any = None,
                 chat_template: Union[ChatTemplate, str, None] = None, timeout_s: Optional[float] = None):
        super().__init__(chat_template)
        import httpx  # imported here: ``import radixlm.lang`` stays light

        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers, verify=True if verify is None else verify,
            timeout=httpx.Timeout(timeout_s, connect=30.0),
            # Programs in run_batch and forks each hold a request open; do not queue them on the pool.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self._http_error = httpx.HTTPError
        try:
            self.model_info = self._get_json("/get_model_info")
        except BackendError:
            self._client.close()
            raise

    # ---- HTTP helpers ----------------------------------------------------------------------
    def _get_json(self, path: str) -> Any:
        try:
            resp = self._client.get(path)
        except self._http_error as exc:
            raise BackendError(f"GET {self.base_url}{path} failed: {exc}") from exc
        _raise_for_status(resp.status_code, resp.text)
        return resp.json()

    # ---- Backend primitives ----------------------------------------------------------------
    def request(self, body: dict[str, Any]) -> Union[dict, list[dict]]:
        try:
            resp = self._client.post("/generate", json=body)
        except self._http_error as exc:
            raise BackendError(f"POST {self.base_url}/generate failed: {exc}") from exc
        _raise_for_status(resp.status_code, resp.text)
        return resp.json()

    def request_stream(self, body: dict[str, Any]) -> Iterator[dict]:
        try:
            with self._client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
                if resp.status_code != 200:
                    _raise_for_status(resp.status_code, resp.read().decode(errors="replace"))
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        return
                    event = json.loads(payload)
                    if "error" in event:  # the server's in-band error: {"message", "type", "code": status}
                        err = event["error"]
                        if not isinstance(err, dict):
                            raise BackendError(str(err))
                        code = err.get("code")
                        raise BackendError(str(err.get("message", err)), code if isinstance(code, int) else None)
                    yield event
        except self._http_error as exc:
            raise BackendError(f"streaming POST {self.base_url}/generate failed: {exc}") from exc

    def get_model_info(self) -> dict[str, Any]:
        return self.model_info

    def get_server_info(self) -> dict[str, Any]:
        return self._get_json("/get_server_info")

    def flush_cache(self) -> bool:
        try:
            resp = self._client.post("/flush_cache")
        except self._http_error as exc:
            raise BackendError(f"POST {self.base_url}/flush_cache failed: {exc}") from exc
        return resp.status_code == 200

    def shutdown(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r})"


def _raise_for_status(status: int, text: str) -> None:
    if status == 200:
        return
    try:
        err = json.loads(text).get("error", text)
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = text
    raise BackendError(message, status)
