"""``Engine``: an in-process backend over ``radixlm.srt.engine.Engine`` (no server, no HTTP).

The srt engine is imported and built on construction (torch is loaded then, not at
``import radixlm.lang``). It is driven synchronously and is not thread-safe, so calls are
serialized with a lock: forks and ``run_batch`` work but do not overlap on this backend. A streamed
gen streams step by step (the srt engine's ``generate(stream=True)``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional, Union

from radixlm.lang.backend import Backend, BackendError
from radixlm.lang.chat_template import ChatTemplate

_ENGINE_ARGS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


class Engine(Backend):
    """In-process backend.

    Args:
        model_path: HF folder, ``.gguf`` file or hub id (``None``: the SmolLM2 demo model).
        engine: an already built ``radixlm.srt.engine.Engine`` to wrap instead (then no other args).
        chat_template: override the template derived from the tokenizer.
        **server_args: any ``ServerArgs`` field (``page_size``, ``max_total_tokens``, ...).

    ``generate(prompt=..., sampling_params=...)`` (keyword form) passes straight to the srt engine,
    for use without the DSL.
    """

    def __init__(self, model_path: Optional[str] = None, *, engine: Any = None,
                 chat_template: Union[ChatTemplate, str, None] = None, **server_args: Any):
        super().__init__(chat_template)
        if engine is None:
            from radixlm.srt.engine import Engine as SrtEngine

            engine = SrtEngine(model_path, **server_args)
        self.engine = engine
        self._lock = threading.Lock()

    def request(self, body: dict[str, Any]) -> Union[dict, list[dict]]:
        from radixlm.managers.validation import InvalidRequestError

        kwargs = {k: body[k] for k in _ENGINE_ARGS if body.get(k) is not None}
        try:
            with self._lock:
                return self.engine.generate(prompt=body.get("text"), input_ids=body.get("input_ids"),
                                            sampling_params=body.get("sampling_params"), **kwargs)
        except InvalidRequestError as exc:
            raise BackendError(str(exc), 400) from exc

    def request_stream(self, body: dict[str, Any]) -> Iterator[dict]:
        from radixlm.managers.validation import InvalidRequestError

        kwargs = {k: body[k] for k in _ENGINE_ARGS if body.get(k) is not None}
        with self._lock:
            try:  # a grammar the backend cannot compile is refused as the stream's last event
                events = self.engine.generate(prompt=body.get("text"), input_ids=body.get("input_ids"),
                                              sampling_params=body.get("sampling_params"), stream=True, **kwargs)
                with contextlib.closing(events):  # an abandoned stream aborts its request
                    yield from events
            except InvalidRequestError as exc:
                raise BackendError(str(exc), 400) from exc

    def get_model_info(self) -> dict[str, Any]:
        args = self.engine.server_args
        path = self.engine.model_config.model_path
        return {"model_path": args.model_path or path, "tokenizer_path": args.tokenizer_path or path,
                "chat_template": getattr(self.engine.tokenizer, "chat_template", None)}

    def get_server_info(self) -> dict[str, Any]:
        """The engine's settings and scheduler state (``radixlm.srt.engine.Engine.get_server_info``)."""
        with self._lock:
            return self.engine.get_server_info()

    def get_chat_template(self) -> ChatTemplate:
        with self._template_lock:
            if self._chat_template is None:
                from radixlm.lang.chat_template import from_tokenizer

                self._chat_template = from_tokenizer(self.engine.tokenizer, str(self.engine.server_args.model_path))
            return self._chat_template

    def flush_cache(self) -> bool:
        with self._lock:
            return bool(self.engine.flush_cache())

    def shutdown(self) -> None:
        self.engine.shutdown()

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """``radixlm.srt.engine.Engine.generate`` (same arguments and results), serialized."""
        with self._lock:
            return self.engine.generate(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Engine({self.engine.server_args.model_path!r})"
