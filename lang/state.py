"""``ProgramState`` (the ``s`` of a program) and ``ProgramStateGroup`` (what ``s.fork(n)`` returns)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Sequence, Union

from radixlm.lang import ir
from radixlm.lang.interpreter import StreamExecutor


class ProgramState:
    """The running state of one program.

    - ``s += "text"`` / ``s += gen("x")`` / ``s += [a, b]`` queue work and return at once.
    - ``s["x"]`` blocks until ``x`` is produced (raises ``ProgramError`` if the program failed first);
      ``s["x"] = v`` sets a variable.
    - ``s.text()``, ``s.messages()`` (OpenAI-style dicts, one per finished role turn) wait for all
      queued work; ``s.get_meta_info("x")`` is the server's ``meta_info`` of gen ``x`` or the choice
      scores of select ``x``; ``s.error()`` is the exception that stopped the program, or None.
    - ``with s.user(): ...`` (also ``system``/``assistant``) wraps the body in the role's chat
      template markup; ``s.user("hi")`` submits a whole turn. ``with s.var_scope("v"): ...`` captures
      the text appended inside into ``v``.
    - ``s.fork(n)``, ``s.copy()``; ``text_iter(var=None)`` / ``text_async_iter(var=None)`` stream.
    - ``ret_value`` holds what the program function returned.
    """

    def __init__(self, executor: StreamExecutor, copy_of: Optional["ProgramStateGroup"] = None):
        self.stream_executor = executor
        self.ret_value: Any = None
        self._copy_of = copy_of  # set on a copy(): leaving `with s.copy() as c:` joins it into s

    # ---- building --------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> "ProgramState":
        self.stream_executor.submit(ir.to_expr(other))
        return self

    def _role(self, role: str, expr: Any) -> Optional[contextlib.AbstractContextManager]:
        if expr is not None:
            self += [ir.RoleBegin(role), expr, ir.RoleEnd(role)]
            return None
        return self._role_scope(role)

    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self += ir.RoleBegin(role)
        yield
        self += ir.RoleEnd(role)

    def system(self, expr: Any = None) -> Any:
        """``with s.system(): ...`` or ``s.system("text")``."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        """``with s.user(): ...`` or ``s.user("text")``."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        """``with s.assistant(): ...`` or ``s.assistant(gen("answer"))``."""
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Capture the text appended inside the block into variable ``name``."""
        self += ir.VarScopeBegin(name)
        yield
        self += ir.VarScopeEnd(name)

    # ---- reading ---------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.stream_executor.variables

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self[name] = value

    def variables(self) -> dict[str, Any]:
        """All variables after the queued work has run."""
        self.sync()
        return dict(self.stream_executor.variables)

    def text(self) -> str:
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return [dict(m) for m in self.stream_executor.messages_]

    def get_meta_info(self, name: str) -> Any:
        """Meta info of variable ``name`` (waits for it): a gen's server ``meta_info`` or a select's scores."""
        self[name]
        return self.stream_executor.meta_info.get(name)

    def error(self) -> Optional[BaseException]:
        self.sync()
        return self.stream_executor.error_

    def raise_if_error(self) -> "ProgramState":
        """Raise the program's error, if any; returns the state otherwise."""
        err = self.error()
        if err is not None:
            raise err
        return self

    def sync(self) -> None:
        self.stream_executor.sync()

    # ---- forks -----------------------------------------------------------------------------
    def fork(self, size: int = 1) -> "ProgramStateGroup":
        """``size`` branches sharing this text and these variables; the prefix is prefilled once first."""
        return ProgramStateGroup([ProgramState(e) for e in self.stream_executor.fork(size)], self)

    def copy(self) -> "ProgramState":
        """A copy of this state (text, variables, messages, role) that runs on its own.

        As SGLang's, it is also a context manager: ``with s.copy() as c: c += gen("x")`` joins ``c``
        back into ``s`` when the block ends (``fork(1)`` + ``join()``: ``s["x"]`` is then ``[value]``).
        """
        group = ProgramStateGroup([], self)
        copy = ProgramState(self.stream_executor.fork(1)[0], copy_of=group)
        group.states.append(copy)
        return copy

    def __enter__(self) -> "ProgramState":
        if self._copy_of is None:
            raise TypeError("only s.copy() is a context manager (`with s.copy() as c:`); roles are `with s.user():`")
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._copy_of is not None  # __enter__ refused anything else
        self._copy_of.join()

    # ---- streaming -------------------------------------------------------------------------
    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        """Yield the program text (or variable ``var_name``) as it arrives; with ``stream=False``
        the final value is yielded once."""
        ex = self.stream_executor
        if not ex.stream:
            yield self.text() if var_name is None else str(self[var_name])
            return
        pos = 0
        while True:
            chunk, done = ex.wait_stream(var_name, pos)
            if chunk:
                pos += len(chunk)
                yield chunk
            elif done:
                return

    async def text_async_iter(self, var_name: Optional[str] = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """``text_iter`` for asyncio code: waits in a thread, never blocks the event loop.

        With ``return_meta_data`` and a ``var_name`` (SGLang's flag) each item is ``(text, meta_info)``:
        the server's ``meta_info`` of that gen as of the chunk (the whole of it with the last chunk).
        """
        loop = asyncio.get_running_loop()
        it = self.text_iter(var_name)
        done = object()
        while True:
            chunk = await loop.run_in_executor(None, next, it, done)
            if chunk is done:
                return
            if return_meta_data and var_name is not None:
                yield chunk, self.stream_executor.meta_so_far(var_name)
            else:
                yield chunk

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The branches of ``s.fork(n)``.

    ``forks += x`` appends ``x`` to every branch; ``forks += lambda i: ...`` per index; a list or
    tuple of ``n`` items element-wise. ``forks[i]`` is a branch's ProgramState. ``join()``
    (``"gather_variable"``) stores each variable created in any branch into the parent as a list with
    one entry per branch (``None`` where a branch did not set it);
    ``join("concate_and_append")`` appends each branch's new text to the parent, in order.
    """

    def __init__(self, states: list[ProgramState], parent: ProgramState):
        self.states = states
        self.parent = parent
        self._vars_at_fork = set(parent.stream_executor.variables)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """Completes ``forks[i] += x`` (Python stores the result back); a branch cannot be replaced."""
        if value is not self.states[i]:
            raise TypeError("a fork's branch cannot be replaced; append to it with forks[i] += ...")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Union[Any, Callable[[int], Any], Sequence[Any]]) -> "ProgramStateGroup":
        if callable(other) and not isinstance(other, ir.Expr):
            for i, s in enumerate(self.states):
                s += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} items for {len(self.states)} branches")
            for s, item in zip(self.states, other):
                s += item
        else:
            for s in self.states:
                s += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch and merge it into the parent (see the class docstring)."""
        for s in self.states:
            s.sync()
        parent = self.parent.stream_executor
        parent.sync()
        if mode == "gather_variable":
            names: dict[str, None] = {}  # every branch's new names, in first-seen order
            for s in self.states:
                names.update(dict.fromkeys(n for n in s.stream_executor.variables if n not in self._vars_at_fork))
            for name in names:
                values = [s.stream_executor.variables.get(name) for s in self.states]
                metas = [s.stream_executor.meta_info.get(name) for s in self.states]
                parent.set_var(name, values, metas)
        elif mode == "concate_and_append":
            self.parent += "".join(s.stream_executor.text_[s.stream_executor.fork_start_text_pos:]
                                   for s in self.states)
        else:
            raise ValueError(f"unknown join mode {mode!r}: use gather_variable or concate_and_append")
        errors = [s.stream_executor.error_ for s in self.states if s.stream_executor.error_ is not None]
        if errors and parent.error_ is None:
            parent.error_ = errors[0]
