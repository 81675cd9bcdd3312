"""The interpreter: executes a program state's IR nodes against a backend.

Each :class:`StreamExecutor` owns a FIFO of submitted nodes. A worker thread is started when work
arrives and exits when the queue is empty, so idle states (finished programs, forgotten copies) hold
no thread. ``submit`` never blocks; reading a variable waits on the event of its latest submission,
which is what lets plain Python branch on generated values. After a failure the executor keeps
draining (skipping) its queue, releasing every waiter; reads of variables that were never produced
raise :class:`ProgramError`.
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from typing import Any, Optional

from radixlm.lang import ir
from radixlm.lang.backend import Backend
from radixlm.lang.chat_template import ChatTemplate


class ProgramError(RuntimeError):
    """Reading a result of a program whose execution failed; ``__cause__`` is the original error."""


class StreamExecutor:
    """Text, variables, messages and roles of one program state, plus its node queue.

    Args:
        backend: where gens and selects go.
        default_params: run-level sampling defaults; each gen's non-None fields override them.
        stream: gens stream, so ``text_iter`` sees text as it arrives.
        use_thread: False executes each node in the submitting thread and raises its errors there
            (used by the prefix tracer).

    The first error that stops the program is kept (``state.error()``) and, unless ``warn_errors`` is
    False (``run(raise_on_error=True)`` raises it instead), reported with a ``RuntimeWarning``, as
    SGLang's executor warns: a failed program otherwise only shows as missing output.
    """

    def __init__(self, backend: Backend, default_params: ir.GenParams, stream: bool = False,
                 use_thread: bool = True):
        self.backend = backend
        self.default_params = default_params
        self.stream = stream
        self.use_thread = use_thread
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.stream_vars: dict[str, str] = {}  # partial values of streaming gens
        self.stream_meta: dict[str, Any] = {}  # their latest meta_info
        self.spans: dict[str, tuple[int, int]] = {}  # where a gen's / select's output sits in text_
        self.error_: Optional[BaseException] = None
        self.warn_errors = True
        self.fork_start_text_pos = 0
        self.cur_role: Optional[str] = None
        self.cur_role_begin_pos = 0
        self.had_role = False
        self.var_scopes: dict[str, int] = {}
        self._var_events: dict[str, threading.Event] = {}
        self._produced_by: dict[str, threading.Event] = {}  # var -> event of the node that set it
        self._queue: deque[tuple[ir.Expr, dict[str, threading.Event]]] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._worker_running = False
        self._ended = False
        # The thread running a stream=True program's body (None otherwise, and for forks): reads from
        # other threads wait for a variable the body has not reached yet instead of missing it.
        self.body_thread: Optional[int] = None
        self._current_events: dict[str, threading.Event] = {}

    # ---- submission and synchronisation ----------------------------------------------------
    def submit(self, expr: ir.Expr) -> None:
        """Queue ``expr``'s nodes; names they will set get fresh (unset) events now."""
        for node in ir.walk(expr):
            with self._cond:
                events = {}
                for name in _produces(node):
                    events[name] = self._var_events[name] = threading.Event()
                self._queue.append((node, events))
                self._pending += 1
                self._cond.notify_all()
                start = self.use_thread and not self._worker_running
                if start:
                    self._worker_running = True
            if not self.use_thread:
                self._drain(raise_errors=True)
            elif start:
                threading.Thread(target=self._drain, name="radixlm-lang-worker", daemon=True).start()

    def sync(self) -> None:
        """Wait until every submitted node has run."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    def end(self) -> None:
        """No more submissions: lets ``text_iter()`` finish once the queue drains."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        return self._ended and self._pending == 0

    def _drain(self, raise_errors: bool = False) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._worker_running = False
                    return
                node, events = self._queue.popleft()
            try:
                if self.error_ is None:
                    self._current_events = events  # whose variable events this node sets
                    self._execute(node)
            except BaseException as exc:  # surfaced through error() and on variable reads
                if raise_errors:
                    self._finish_node(events)
                    raise
                self.record_error(exc)
            self._finish_node(events)

    def record_error(self, exc: BaseException) -> None:
        """Keep ``exc`` as the program's error if it is the first; warn about it (see the class)."""
        if self.error_ is not None:
            return
        self.error_ = exc
        if self.warn_errors:
            try:
                warnings.warn(f"prompt program stopped by {type(exc).__name__}: {exc} (kept in state.error())",
                              RuntimeWarning, stacklevel=2)
            except Warning:  # warnings made errors (-W error): raised here it would stop the worker
                pass         # thread before it releases the program's waiters; the error is kept above

    def _finish_node(self, events: dict[str, threading.Event]) -> None:
        for ev in events.values():
            ev.set()
        with self._cond:
            self._pending -= 1
            self._cond.notify_all()

    # ---- variables -------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:
        """The variable's value once its latest submission has run; raises ProgramError if it failed."""
        with self._cond:
            if self.body_thread is not None and self.body_thread != threading.get_ident():
                self._cond.wait_for(lambda: name in self._var_events or name in self.variables or self._ended)
            ev = self._var_events.get(name)
        if ev is None:
            if name in self.variables:
                return self.variables[name]
            raise KeyError(f"no variable {name!r} in this program")
        ev.wait()
        if self._produced_by.get(name) is not ev:
            raise ProgramError(f"variable {name!r} was not produced: the program failed") from self.error_
        return self.variables[name]

    def set_var(self, name: str, value: Any, meta: Any = None) -> None:
        ev = threading.Event()
        with self._cond:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            self._var_events[name] = self._produced_by[name] = ev
            ev.set()
            self._cond.notify_all()

    def meta_so_far(self, name: str) -> Any:
        """The meta info of variable ``name``: final once its gen is done, else the stream's latest."""
        with self._cond:
            ev = self._var_events.get(name)
            if ev is not None and ev.is_set():
                return self.meta_info.get(name)
            return self.stream_meta.get(name)

    def wait_stream(self, var: Optional[str], pos: int) -> tuple[str, bool]:
        """Block until text past ``pos`` exists or the source is done; returns ``(new_text, done)``.

        The source is the whole program text (``var=None``) or a variable's streamed value.
        """
        def ready() -> tuple[str, bool]:
            if var is None:
                return self.text_[pos:], self.finished
            ev = self._var_events.get(var)
            done = (ev is not None and ev.is_set()) or (ev is None and self.finished)
            if ev is not None and ev.is_set() and self._produced_by.get(var) is ev:
                # A streamed gen's iterator ends with what was streamed (separate_reasoning may have
                # rewritten the variable since); anything else with its value.
                value = self.stream_vars[var] if var in self.stream_vars else self.variables[var]
                return (str(value)[pos:] if isinstance(value, str) else ""), True
            return self.stream_vars.get(var, "")[pos:], done

        with self._cond:
            self._cond.wait_for(lambda: ready()[0] != "" or ready()[1])
            return ready()

    # ---- node execution --------------------------------------------------------------------
    def _append(self, text: str, var: Optional[str] = None) -> None:
        with self._cond:
            self.text_ += text
            if var is not None:
                self.stream_vars[var] = self.stream_vars.get(var, "") + text
            self._cond.notify_all()

    def template(self) -> ChatTemplate:
        return self.backend.get_chat_template()

    def _execute(self, node: ir.Expr) -> None:
        if isinstance(node, ir.Text):
            self._append(node.value)
        elif isinstance(node, ir.Gen):
            self._execute_gen(node)
        elif isinstance(node, ir.Select):
            decision = self.backend.select(self.text_, node.choices, node.choices_method)
            start = len(self.text_)
            self._append(decision.decision)
            self._set_result(node.name, decision.decision, decision.meta_info, (start, len(self.text_)))
        elif isinstance(node, ir.SeparateReasoning):
            self._separate_reasoning(node)
        elif isinstance(node, ir.RoleBegin):
            self._role_begin(node.role)
        elif isinstance(node, ir.RoleEnd):
            self._role_end(node.role)
        elif isinstance(node, ir.VarScopeBegin):
            self.var_scopes[node.name] = len(self.text_)
        elif isinstance(node, ir.VarScopeEnd):
            if node.name not in self.var_scopes:
                raise ValueError(f"var_scope {node.name!r} ended without a beginning")
            self._set_result(node.name, self.text_[self.var_scopes.pop(node.name):], None)
        elif isinstance(node, ir.CommitLazy):
            if self.text_:
                self.backend.cache_prefix(self.text_)
        else:
            raise TypeError(f"cannot execute {node!r}")

    def _set_result(self, name: Optional[str], value: Any, meta: Any,
                    span: Optional[tuple[int, int]] = None) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            if span is not None:
                self.spans[name] = span
            self._produced_by[name] = self._current_events[name]

    def _execute_gen(self, node: ir.Gen) -> None:
        stop = self.template().stop_str if self.cur_role == "assistant" else None
        params = node.params.merged_over(self.default_params).resolved(stop)
        prompt = self.text_
        start = len(prompt)
        if not self.stream:
            value, meta = self.backend.complete(prompt, params)
            self._append(value[0] if isinstance(value, list) else value)  # n > 1: the text goes on with the first
        else:
            if node.name is not None:
                with self._cond:
                    self.stream_vars[node.name] = ""
                    self.stream_meta.pop(node.name, None)
            meta = None
            for delta, meta in self.backend.complete_stream(prompt, params):
                if node.name is not None and meta is not None:
                    self.stream_meta[node.name] = meta
                if delta:
                    self._append(delta, node.name)
            value = self.text_[start:]
        self._set_result(node.name, value, meta, (start, len(self.text_)))

    def _separate_reasoning(self, node: ir.SeparateReasoning) -> None:
        """Split a finished output into answer and reasoning (``ir.SeparateReasoning``)."""
        from radixlm.srt.reasoning_parser import ReasoningStream, get_reasoning_format, starts_in_reasoning

        value = self.variables.get(node.name)
        if node.name not in self._produced_by or not isinstance(value, str):
            raise ValueError(f"separate_reasoning: {node.name!r} is not the text of a finished gen or select")
        fmt = get_reasoning_format(node.model_type)
        start, end = self.spans.get(node.name, (len(self.text_), len(self.text_)))
        split = ReasoningStream(fmt, starts_in_reasoning(fmt, self.text_[:start]))
        split.feed(value)
        split.finish()
        with self._cond:
            self.variables[node.name] = split.content
            self.variables[node.reasoning_name] = split.reasoning
            for name in (node.name, node.reasoning_name):
                self._produced_by[name] = self._current_events[name]
            if not self.stream and self.text_[start:end] == value:  # streamed text stays as it was sent
                self.text_ = self.text_[:start] + split.content + self.text_[end:]
                self.spans[node.name] = (start, start + len(split.content))
            self._cond.notify_all()

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {role!r} begins inside role {self.cur_role!r}: roles do not nest")
        template = self.template()
        if role not in template.roles:
            raise ValueError(f"unknown role {role!r}")
        if not self.had_role and role != "system" and template.default_system_prompt:
            self.had_role = True
            self._role_begin("system")
            self._append(template.default_system_prompt)
            self._role_end("system")
        self.had_role = True
        self._append(template.prefix(role))
        self.cur_role, self.cur_role_begin_pos = role, len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"role {role!r} ends but the current role is {self.cur_role!r}")
        with self._cond:
            # Leading whitespace only, as SGLang: a turn's trailing newlines are the model's.
            self.messages_.append({"role": role, "content": self.text_[self.cur_role_begin_pos:].lstrip()})
        self._append(self.template().suffix(role))
        self.cur_role = None

    # ---- fork ------------------------------------------------------------------------------
    def fork(self, n: int) -> list["StreamExecutor"]:
        """``n`` children starting from this state; with ``n > 1`` the text is first prefilled once."""
        if n > 1 and (self.text_ or self._pending):
            self.submit(ir.CommitLazy())
        self.sync()
        return [self._child() for _ in range(n)]

    def _child(self) -> "StreamExecutor":
        child = StreamExecutor(self.backend, self.default_params, self.stream, self.use_thread)
        with self._cond:
            child.text_ = self.text_
            child.messages_ = [dict(m) for m in self.messages_]
            child.meta_info = dict(self.meta_info)
            child.error_ = self.error_
            child.cur_role, child.cur_role_begin_pos, child.had_role = self.cur_role, self.cur_role_begin_pos, self.had_role
            child.var_scopes = dict(self.var_scopes)
            for name, value in self.variables.items():
                child.set_var(name, value)
        child.fork_start_text_pos = len(child.text_)
        return child


def _produces(node: ir.Expr) -> tuple[str, ...]:
    """The variables ``node`` sets (a read of one waits for the latest node that sets it)."""
    if isinstance(node, (ir.Gen, ir.Select)):
        return () if node.name is None else (node.name,)
    if isinstance(node, ir.VarScopeEnd):
        return (node.name,)
    if isinstance(node, ir.SeparateReasoning):  # rewrites the answer, adds the reasoning
        return (node.name, node.reasoning_name)
    return ()
