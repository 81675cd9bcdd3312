"""``Program`` (what ``@function`` returns): run one program, a batch, or cache its prefix."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from radixlm.lang import defaults
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.ir import RUN_DEFAULTS, GenParams
from radixlm.lang.state import ProgramState

logger = logging.getLogger(__name__)

_PARAM_NAMES = {f.name for f in dataclasses.fields(GenParams)} - {"dtype", "regex", "json_schema"}


class Program:
    """A prompt program: ``func(s, *args)`` that appends to ``s``.

    - ``program.run(*args, stream=False, backend=None, raise_on_error=False, <sampling defaults>,
      **kwargs) -> ProgramState``; sampling defaults are ``GenParams`` fields (``max_new_tokens``,
      ``temperature``, ``stop``, ...) that every gen inherits unless it sets its own.
    - ``program.run_batch(list_of_kwargs, num_threads="auto", progress_bar=False, generator_style=False,
      <sampling defaults>)``.
    - ``program.bind(**kwargs)`` fixes arguments; ``program.cache(backend)`` prefills the prefix.
    - ``program(s, *args)`` inside another program runs the body on that state.
    """

    def __init__(self, func: Callable[..., Any], bound: Optional[dict[str, Any]] = None):
        names = list(inspect.signature(func).parameters)
        if not names or names[0] != "s":
            raise TypeError(f"the first parameter of a program must be named 's' ({func.__name__})")
        self.func = func
        self.arg_names = names[1:]
        self.bound = dict(bound or {})
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> "Program":
        """A copy of this program with some arguments fixed."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.func.__name__} has no parameter(s) {', '.join(sorted(unknown))}")
        return Program(self.func, {**self.bound, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], ProgramState):
            return self.func(args[0], *args[1:], **{**self.bound, **kwargs})
        return self.run(*args, **kwargs)

    def _split_defaults(self, kwargs: dict[str, Any]) -> GenParams:
        """Pop sampling defaults (names that are not program parameters) out of ``kwargs``."""
        picked = {k: kwargs.pop(k) for k in list(kwargs) if k in _PARAM_NAMES and k not in self.arg_names}
        if "max_tokens" in kwargs and "max_tokens" not in self.arg_names:
            picked["max_new_tokens"] = kwargs.pop("max_tokens")
        base = GenParams.from_kwargs(**RUN_DEFAULTS)
        return GenParams.from_kwargs(**picked).merged_over(base)

    def run(self, *args: Any, stream: bool = False, backend: Any = None, raise_on_error: bool = False,
            **kwargs: Any) -> ProgramState:
        """Run once. Returns when the program is done, or at once with ``stream=True`` (the body then
        runs on its own thread; use ``text_iter``).

        Exceptions raised by the program's Python code propagate (``stream=False``); failures of the
        backend are kept in ``state.error()`` and raised here when ``raise_on_error``.
        """
        params = self._split_defaults(kwargs)
        state = self._new_state(defaults.resolve_backend(backend), params, stream)
        state.stream_executor.warn_errors = stream or not raise_on_error  # raised below instead
        call_args = {**self.bound, **kwargs}
        if stream:
            body = threading.Thread(target=self._execute, args=(state, args, call_args, True), daemon=True,
                                    name=f"radixlm-lang-{self.func.__name__}")
            body.start()
            state.stream_executor.body_thread = body.ident
            return state
        self._execute(state, args, call_args, capture=False)
        if raise_on_error:
            state.raise_if_error()
        return state

    def run_batch(self, batch_kwargs: Sequence[Union[dict[str, Any], Sequence[Any]]], *,
                  num_threads: Union[int, str] = "auto", progress_bar: bool = False, backend: Any = None,
                  generator_style: bool = False,
                  **kwargs: Any) -> Union[list[ProgramState], Iterator[ProgramState]]:
        """Run the program once per item (a kwargs dict or an args tuple) on a thread pool (SGLang's
        ``run_batch``). ``kwargs``: sampling defaults only (``GenParams`` fields, ``max_tokens``);
        each item carries its program arguments.

        Returns the states in input order: a list, or with ``generator_style`` a generator that yields
        each state as soon as it and the ones before it are done. As in SGLang (and as ``run``), an
        exception raised by a program's Python code propagates here, once the batch's other programs
        have finished; a failure of the backend (an HTTP 400, an aborted request) does not: that
        program's state carries it (``state.error()``) and the others are not affected. A constant
        prefix longer than 64 characters is prefilled once before the threads start.

        Raises:
            Exception: the first (in input order) exception raised by a program's own code.
            TypeError: a keyword that is not a sampling default (a misspelt ``temprature`` would
                otherwise sample at the default temperature), or an item that is neither a dict nor a
                sequence of arguments.
        """
        params = self._split_defaults(kwargs)
        if kwargs:
            raise TypeError(f"run_batch() got unexpected keyword argument(s) {', '.join(map(repr, sorted(kwargs)))}: "
                            f"it takes sampling defaults ({', '.join(sorted(_PARAM_NAMES | {'max_tokens'}))}); "
                            f"program arguments go in each batch item")
        for i, item in enumerate(batch_kwargs):
            if not isinstance(item, (dict, list, tuple)):
                raise TypeError(f"run_batch() item {i} is a {type(item).__name__}: each item is a dict of keyword "
                                f"arguments or a list/tuple of positional arguments of {self.func.__name__}")
        states = self._batch_states(list(batch_kwargs), num_threads, progress_bar, backend, params)
        return states if generator_style else list(states)

    def _batch_states(self, items: list[Any], num_threads: Union[int, str], progress_bar: bool, backend: Any,
                      params: GenParams) -> Iterator[ProgramState]:
        if not items:
            return
        resolved = defaults.resolve_backend(backend)
        if len(items) > 1:
            self._precache(resolved)
        if num_threads == "auto":
            num_threads = max(96, (os.cpu_count() or 1) * 16)
        workers = max(1, min(int(num_threads), len(items)))

        def one(item: Any) -> ProgramState:
            state = self._new_state(resolved, params, stream=False)
            args, call_kwargs = ((), dict(item)) if isinstance(item, dict) else (tuple(item), {})
            self._execute(state, args, {**self.bound, **call_kwargs}, capture=False)
            return state

        from tqdm.auto import tqdm

        with ThreadPoolExecutor(workers, thread_name_prefix="radixlm-lang-batch") as pool, \
                tqdm(total=len(items), disable=not progress_bar, desc=self.func.__name__) as bar:
            futures = [pool.submit(one, item) for item in items]
            for future in futures:  # in input order; the pool runs ahead
                state = future.result()
                bar.update(1)
                yield state

    def cache(self, backend: Any = None) -> str:
        """Prefill this program's constant prefix into the server's cache; returns the prefix."""
        from radixlm.lang.tracer import extract_prefix

        resolved = defaults.resolve_backend(backend)
        prefix = extract_prefix(self, resolved)
        if prefix:
            resolved.cache_prefix(prefix)
        return prefix

    def trace_prefix(self, backend: Any = None) -> str:
        """The constant text every run of this program starts with (nothing is sent)."""
        from radixlm.lang.tracer import extract_prefix

        return extract_prefix(self, defaults.resolve_backend(backend))

    # ---- internals -------------------------------------------------------------------------
    @staticmethod
    def _new_state(backend: Any, params: GenParams, stream: bool) -> ProgramState:
        return ProgramState(StreamExecutor(backend, params, stream=stream))

    def _execute(self, state: ProgramState, args: tuple, kwargs: dict[str, Any], capture: bool) -> None:
        executor = state.stream_executor
        try:
            state.ret_value = self.func(state, *args, **kwargs)
            executor.sync()
        except BaseException as exc:
            executor.sync()
            if not capture:  # it propagates to the caller: no warning
                if executor.error_ is None:
                    executor.error_ = exc
                raise
            executor.record_error(exc)
        finally:
            executor.end()

    def _precache(self, backend: Any) -> None:
        from radixlm.lang.tracer import MIN_PREFIX_CHARS, extract_prefix

        try:
            prefix = extract_prefix(self, backend)
            if len(prefix) > MIN_PREFIX_CHARS:
                backend.cache_prefix(prefix)
        except Exception as exc:  # an optimisation only: the batch itself reports real failures
            logger.warning("could not precache the prefix of %s: %s", self.func.__name__, exc)

    def __repr__(self) -> str:
        return f"Program({self.func.__name__})"
