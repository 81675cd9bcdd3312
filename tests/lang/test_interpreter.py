"""Interpreter mechanics on the in-memory FakeBackend: variables, roles, errors, forks, streaming,
batches and prefix tracing (no server; milliseconds)."""

import asyncio
import threading
import time

import pytest

import radixlm.lang as rl

from .fake_backend import CHATML, FakeBackend


def run(program, backend, **kwargs):
    return program.run(backend=backend, **kwargs)


def test_gen_appends_stores_and_inherits_run_defaults():
    backend = FakeBackend({"Q: 2+2?\nA:": " 4\nQ: next"})

    @rl.function
    def qa(s, q):
        s += "Q: " + q + "\nA:"
        s += rl.gen("a", stop="\n", temperature=0.5)

    state = run(qa, backend, q="2+2?", max_new_tokens=7, top_p=0.9)
    assert state["a"] == " 4"
    assert state.text() == "Q: 2+2?\nA: 4"
    sp = backend.bodies[0]["sampling_params"]
    assert sp["max_new_tokens"] == 7 and sp["top_p"] == 0.9 and sp["temperature"] == 0.5
    assert sp["stop"] == ["\n"] and sp["top_k"] == -1
    assert state.get_meta_info("a")["prompt_tokens"] == len("Q: 2+2?\nA:") + 1


def test_gen_with_choices_is_a_select():
    backend = FakeBackend(scores={"a": -0.1, "b": -3.0})

    @rl.function
    def prog(s):
        s += "pick: " + rl.gen("x", choices=["a", "b"])

    state = run(prog, backend)
    assert state["x"] == "a" and state.text() == "pick: a"
    assert state.get_meta_info("x")["normalized_prompt_logprobs"] == pytest.approx([-0.1, -3.0])


def test_dtype_becomes_a_regex_with_number_stops():
    backend = FakeBackend(default="24")

    @rl.function
    def prog(s):
        s += rl.gen_int("n") + rl.gen("b", dtype=bool) + rl.gen_string("t", regex="ignored")

    state = run(prog, backend)
    int_sp, bool_sp, str_sp = (b["sampling_params"] for b in backend.bodies)
    assert int_sp["regex"] == r"[-+]?[0-9]+[ \n]*" and int_sp["stop"] == [" ", "\n"]
    assert bool_sp["regex"] == "(True|False)" and "stop" not in bool_sp
    assert str_sp["regex"] == r"\"[\w\d\s]*\""
    assert int(state["n"]) == 24
    with pytest.raises(Exception):
        rl.gen("x", regex="(unclosed")


def test_variable_reads_block_and_python_branches_on_them():
    backend = FakeBackend({"Action:": " Search", "Result:": " found"})

    @rl.function
    def agent(s):
        s += "Action:" + rl.gen("action", max_tokens=10)
        if s["action"].strip() == "Search":
            s += "\nResult:" + rl.gen("result")
        else:
            s += "\nDone"

    state = run(agent, backend)
    assert state["result"] == " found"
    assert state.text() == "Action: Search\nResult: found"


def test_a_variable_generated_twice_reads_its_latest_value():
    backend = FakeBackend({"1:": "one", "2:": "two"})

    @rl.function
    def loop(s):
        seen = []
        for i in (1, 2):
            s += f"\n{i}:" + rl.gen("x")
            seen.append(s["x"])
        return seen

    assert run(loop, backend).ret_value == ["one", "two"]


def test_roles_render_the_template_and_fill_messages():
    backend = FakeBackend({"assistant\n": "Paris"}, chat_template=CHATML)

    @rl.function
    def chat(s):
        s += rl.user("Capital of France?")
        s += rl.assistant(rl.gen("answer"))
        with s.user():
            s += "Thanks"

    state = run(chat, backend)
    assert state.text() == ("<|im_start|>system\nYou are a test.<|im_end|>\n"
                            "<|im_start|>user\nCapital of France?<|im_end|>\n"
                            "<|im_start|>assistant\nParis<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n")
    assert state.messages() == [{"role": "system", "content": "You are a test."},
                                {"role": "user", "content": "Capital of France?"},
                                {"role": "assistant", "content": "Paris"},
                                {"role": "user", "content": "Thanks"}]
    assert backend.bodies[0]["sampling_params"]["stop"] == ["<|im_end|>"]  # only inside assistant


def test_explicit_system_turn_replaces_the_default_and_roles_do_not_nest():
    backend = FakeBackend(chat_template=CHATML)

    @rl.function
    def prog(s):
        s += rl.system("Be brief.") + rl.user("hi")

    assert [m["role"] for m in run(prog, backend).messages()] == ["system", "user"]

    @rl.function
    def nested(s):
        with s.user():
            s += rl.assistant("x")

    state = run(nested, backend)
    assert isinstance(state.error(), ValueError)


@rl.function
def fails_at_its_first_gen(s):  # FakeBackend answers a prompt containing FAIL with a 400
    s += "FAIL" + rl.gen("a")
    s += rl.gen("b")


def test_backend_failure_is_kept_and_reads_raise():
    backend = FakeBackend()
    prog = fails_at_its_first_gen

    state = run(prog, backend)
    assert isinstance(state.error(), rl.BackendError) and state.error().status_code == 400
    with pytest.raises(rl.ProgramError):
        state["b"]
    with pytest.raises(rl.BackendError):
        run(prog, backend, raise_on_error=True)

    @rl.function
    def reads(s):
        s += "FAIL" + rl.gen("a")
        return s["a"]

    with pytest.raises(rl.ProgramError):
        run(reads, backend)


def test_a_failed_program_warns_once_with_its_error_unless_it_is_raised():
    backend = FakeBackend()
    prog = fails_at_its_first_gen

    @rl.function
    def fine(s):
        s += "ok" + rl.gen("a")

    with pytest.warns(RuntimeWarning, match=r"stopped by BackendError: 400: prompt contains FAIL") as caught:
        state = run(prog, backend)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert isinstance(state.error(), rl.BackendError)
    with pytest.warns(RuntimeWarning, match="prompt contains FAIL"):
        streamed = run(prog, backend, stream=True)
        assert "".join(streamed.text_iter()) == "FAIL"
    assert isinstance(streamed.error(), rl.BackendError)

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails here
        assert run(fine, backend).error() is None
        with pytest.raises(rl.BackendError):
            run(prog, backend, raise_on_error=True)
        # With warnings made errors (-W error) the failure is still kept and every waiter released:
        # the warning raised in the worker thread stopped it there, and reading a variable hung.
        done: list = []
        reader = threading.Thread(target=lambda: done.append(run(prog, backend)), daemon=True)
        reader.start()
        reader.join(10)
        assert done and isinstance(done[0].error(), rl.BackendError)
        with pytest.raises(rl.ProgramError):
            done[0]["b"]


def test_fork_caches_the_prefix_once_and_join_gathers_lists():
    backend = FakeBackend({"A": "-a", "B": "-b", "C": "-c"})

    @rl.function
    def prog(s):
        s += "prefix "
        forks = s.fork(3)
        forks += lambda i: "ABC"[i]
        forks += rl.gen("x")
        forks.join()
        s += " then"
        return forks

    state = run(prog, backend)
    assert backend.cached == ["prefix "]
    assert state["x"] == ["-a", "-b", "-c"]
    assert [m["prompt_tokens"] for m in state.get_meta_info("x")] == [9, 9, 9]
    assert state.text() == "prefix  then"
    assert [f.text() for f in state.ret_value] == ["prefix A-a", "prefix B-b", "prefix C-c"]


def test_fork_elementwise_concat_join_and_copy():
    backend = FakeBackend(default="!")

    @rl.function
    def prog(s):
        s += "p:"
        forks = s.fork(2)
        forks += ["x", "y"]
        forks.join("concate_and_append")
        c = s.copy()
        c += "copy-only"
        return c

    state = run(prog, backend)
    assert state.text() == "p:xy"
    assert state.ret_value.text() == "p:xycopy-only"


def test_var_scope_captures_text():
    backend = FakeBackend(default="Paris")

    @rl.function
    def prog(s):
        s += "{"
        with s.var_scope("obj"):
            s += '"city": "' + rl.gen("city") + '"'
        s += "}"

    assert run(prog, backend)["obj"] == '"city": "Paris"'


def test_stream_text_iter_and_async_iter_equal_the_final_text():
    backend = FakeBackend(default="hello world", stream_delay_s=0.002)

    @rl.function
    def prog(s):
        s += "Say:" + rl.gen("a") + " / " + rl.gen("b")

    state = run(prog, backend, stream=True)
    chunks = list(state.text_iter())
    assert len(chunks) > 5 and "".join(chunks) == state.text() == "Say:hello world / hello world"
    state = run(prog, backend, stream=True)
    assert "".join(state.text_iter("b")) == "hello world"

    async def collect():
        return [c async for c in run(prog, backend, stream=True).text_async_iter("a")]

    assert "".join(asyncio.run(collect())) == "hello world"
    assert list(run(prog, backend).text_iter("a")) == ["hello world"]  # not streaming: once


def test_run_batch_keeps_order_isolates_failures_and_shows_progress(capsys):
    backend = FakeBackend(default="#")

    @rl.function
    def prog(s, i):
        s += f"item {i}" + rl.gen("out")
        if i == 7:
            s += "FAIL" + rl.gen("bad")

    states = prog.run_batch([{"i": i} for i in range(12)], backend=backend, num_threads=4, progress_bar=True)
    assert [s.text() for s in states if s.error() is None] == [f"item {i}#" for i in range(12) if i != 7]
    assert isinstance(states[7].error(), rl.BackendError)
    assert "12/12" in capsys.readouterr().err
    prog.run_batch([{"i": 0}], backend=backend)  # SGLang's default: no progress bar
    assert "1/1" not in capsys.readouterr().err


def test_run_batch_generator_style_yields_in_order_and_bad_arguments_raise():
    backend = FakeBackend(default="#")

    @rl.function
    def prog(s, i):
        s += f"item {i}" + rl.gen("out", max_tokens=4)

    gen = prog.run_batch([(i,) for i in range(6)], backend=backend, num_threads=3, generator_style=True)
    assert not isinstance(gen, list)
    assert [s.text() for s in gen] == [f"item {i}#" for i in range(6)]
    assert [s.text() for s in prog.run_batch([[1], {"i": 2}], backend=backend)] == ["item 1#", "item 2#"]
    sent = len(backend.bodies)
    # a misspelt sampling default used to be dropped (sampling at temperature 1.0 instead of greedy)
    with pytest.raises(TypeError, match="'temprature'"):
        prog.run_batch([{"i": 1}], backend=backend, temprature=0)
    with pytest.raises(TypeError, match="item 1 is a int"):
        prog.run_batch([{"i": 1}, 2], backend=backend)
    assert len(backend.bodies) == sent  # nothing was sent for the refused batches
    prog.run_batch([{"i": 1}], backend=backend, temperature=0, max_tokens=2)
    assert backend.bodies[-1]["sampling_params"]["temperature"] == 0


def test_prefix_tracing_stops_at_arguments_and_gens():
    backend = FakeBackend(chat_template=CHATML)
    long = "You are a careful assistant that answers questions about geography. " * 2

    @rl.function
    def prog(s, question):
        s += rl.system(long)
        s += rl.user(question)
        s += rl.assistant(rl.gen("answer"))

    assert prog.trace_prefix(backend) == f"<|im_start|>system\n{long}<|im_end|>\n"

    @rl.function
    def block_form(s, question):
        with s.user():
            s += "Question: " + question

    assert block_form.trace_prefix(backend) == "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\n"
    prog.run_batch([{"question": "a?"}, {"question": "b?"}], backend=backend, progress_bar=False)
    assert backend.cached[0] == prog.trace_prefix(backend)
    assert backend.bodies[0]["text"] == backend.cached[0]  # sent before any program


def test_bind_and_nested_program_call():
    backend = FakeBackend(default="!")

    @rl.function
    def inner(s, word):
        s += word + rl.gen("x")

    @rl.function
    def outer(s, a, b):
        inner(s, a)
        s += " " + b

    assert run(outer.bind(b="end"), backend, a="go").text() == "go! end"
    with pytest.raises(TypeError):
        rl.function(lambda x: None)


def test_gen_runs_while_python_continues():
    release = threading.Event()

    class Slow(FakeBackend):
        def request(self, body):
            release.wait(5)
            return super().request(body)

    @rl.function
    def prog(s):
        s += "a" + rl.gen("x")
        release.set()  # reached before the gen finished: submission does not block

    start = time.monotonic()
    assert run(prog, Slow(default="b")).text() == "ab"
    assert time.monotonic() - start < 5


def test_join_gathers_variables_that_only_later_branches_created():
    backend = FakeBackend(default="!")

    @rl.function
    def prog(s):
        s += "p:"
        forks = s.fork(3)
        forks += lambda i: rl.gen(f"tip_{i}")
        forks.join()

    state = run(prog, backend)
    assert state["tip_0"] == ["!", None, None]
    assert state["tip_1"] == [None, "!", None]
    assert state["tip_2"] == [None, None, "!"]


def test_stream_run_reads_a_variable_the_body_has_not_reached_yet():
    backend = FakeBackend(default=" blue")

    @rl.function
    def prog(s):
        s += "Color:"
        time.sleep(0.2)  # the body is still busy when the caller reads
        s += rl.gen("a")

    state = prog.run(backend=backend, stream=True)
    assert state["a"] == " blue"  # was KeyError: no variable 'a' (not submitted yet)
    assert state.get_meta_info("a") is not None
    with pytest.raises(KeyError):  # a name the finished program never produces still fails, at once
        state["never"]


def test_appending_values_that_are_not_text_raises():
    backend = FakeBackend()

    @rl.function
    def sub(s, x):
        s += f" sub({x})"

    @rl.function
    def outer(s, value):
        s += "Outer"
        s += value

    assert outer.run(3, backend=backend).text() == "Outer3"  # numbers as text
    assert outer.run([" a", 2.5], backend=backend).text() == "Outer a2.5"
    # these used to be appended as their repr ("OuterProgramState(' sub(1)')", "Outerb'x'")
    for value, match in ((sub.run(1, backend=backend), r"ProgramState.*call it as sub\(s, \.\.\.\)"),
                         (b"x", "bytes.*decode"), ({"k": 1}, "dict"), (None, "NoneType"), (True, "bool")):
        with pytest.raises(TypeError, match=match):
            outer.run(value, backend=backend)

    @rl.function
    def nested(s):
        s += "Outer"
        sub(s, 1)

    assert nested.run(backend=backend).text() == "Outer sub(1)"
