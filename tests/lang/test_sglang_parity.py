"""SGLang frontend idioms a ported program relies on (sglang/lang/api.py, interpreter.py), on the
in-memory FakeBackend: ``forks[i] +=``, ``with s.copy()``, run_batch raising the program's own
exceptions, custom choice methods without meta info, ``text_async_iter(return_meta_data=True)``,
``gen(n=..., stop_regex=...)``, empty role turns, ``separate_reasoning`` and ``messages()``
whitespace."""

import asyncio
import re

import pytest

import radixlm.lang as rl

from .fake_backend import CHATML, FakeBackend


def test_appending_to_one_branch_by_index():
    backend = FakeBackend({"A": "-a", "B": "-b"})

    @rl.function
    def prog(s):
        s += "Q:"
        forks = s.fork(2)
        forks[0] += "A" + rl.gen("x")
        forks[1] += "B" + rl.gen("x")
        forks.join()

    assert run_ok(prog, backend)["x"] == ["-a", "-b"]

    @rl.function
    def replace(s):
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(TypeError, match="cannot be replaced"):
        replace.run(backend=backend)


def test_copy_as_a_context_manager_joins_its_variables():
    backend = FakeBackend(default="hi")

    @rl.function
    def prog(s):
        s += "Hello"
        with s.copy() as c:
            c += rl.gen("x", max_tokens=2)
        plain = s.copy()  # without `with`: an independent state, never joined
        plain += rl.gen("y")
        return plain

    state = run_ok(prog, backend)
    assert state["x"] == ["hi"] and "y" not in state
    assert state.text() == "Hello" and state.ret_value.text() == "Hellohi"

    @rl.function
    def misuse(s):
        with s:
            pass

    with pytest.raises(TypeError, match="only s.copy"):
        misuse.run(backend=backend)


def test_run_batch_raises_a_programs_own_exception_after_the_others_finish():
    backend = FakeBackend(default="#")
    done = []

    @rl.function
    def prog(s, i):
        if i == 3:
            raise ValueError("boom")
        s += f"item {i}" + rl.gen("out")
        s.sync()
        done.append(i)

    with pytest.raises(ValueError, match="boom"):
        prog.run_batch([{"i": i} for i in range(8)], backend=backend, num_threads=4)
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="boom"):
        list(prog.run_batch([{"i": 3}], backend=backend, generator_style=True))


def test_a_custom_choices_method_may_leave_meta_info_none():
    class First(rl.ChoicesSamplingMethod):
        def __call__(self, *, choices, **kwargs):
            return rl.ChoicesDecision(decision=choices[0], meta_info=None)

    @rl.function
    def prog(s):
        s += "Pick:" + rl.select("c", choices=[" a", " b"], choices_method=First())

    state = run_ok(prog, FakeBackend(scores={"b": 0.0}))
    assert state["c"] == " a" and state.text() == "Pick: a"
    assert len(state.get_meta_info("c")["normalized_prompt_logprobs"]) == 2


def test_text_async_iter_returns_meta_data_with_each_chunk():
    backend = FakeBackend(default="hello", stream_delay_s=0.002)

    @rl.function
    def prog(s):
        s += "Say:" + rl.gen("a")

    async def collect(stream):
        state = prog.run(backend=backend, stream=stream)
        return [item async for item in state.text_async_iter("a", return_meta_data=True)]

    items = asyncio.run(collect(True))
    assert "".join(text for text, _ in items) == "hello"
    assert all(isinstance(meta, dict) for _, meta in items)
    assert items[-1][1]["prompt_tokens"] == 5  # the final meta_info: BOS + "Say:"
    assert asyncio.run(collect(False)) == [("hello", {"prompt_tokens": 5, "cached_tokens": 0,
                                                      "finish_reason": {"type": "length"}})]


def test_gen_n_samples_a_list_and_the_text_goes_on_with_the_first():
    backend = FakeBackend({"Q:": ["one", "two", "three"]})

    @rl.function
    def prog(s):
        s += "Q:" + rl.gen("x", n=3, max_tokens=8) + "."

    state = run_ok(prog, backend)
    assert state["x"] == ["one", "two", "three"] and state.text() == "Q:one."
    assert len(state.get_meta_info("x")) == 3
    assert backend.bodies[0]["sampling_params"]["n"] == 3
    streamed = prog.run(backend=backend, stream=True)
    assert "".join(streamed.text_iter()) == "Q:"  # ends when the program does
    assert isinstance(streamed.error(), ValueError) and "cannot stream" in str(streamed.error())
    with pytest.raises(ValueError, match="at least 1"):
        rl.gen("x", n=0)


def test_gen_stop_regex_goes_to_the_server_and_is_checked_first():
    backend = FakeBackend()

    @rl.function
    def prog(s):
        s += "Count:" + rl.gen("x", stop_regex=r"\d{2}") + rl.gen("y", stop_regex=["a+", "b"])

    run_ok(prog, backend)
    assert [b["sampling_params"]["stop_regex"] for b in backend.bodies] == [r"\d{2}", ["a+", "b"]]
    with pytest.raises(re.error):
        rl.gen("x", stop_regex=["ok", "(unclosed"])


def test_role_with_no_content_is_an_empty_turn_and_messages_keep_trailing_text():
    backend = FakeBackend(chat_template=CHATML)

    @rl.function
    def prog(s):
        s += rl.user("  Say hi")
        s += rl.assistant("  Hello there\n\n")
        s += rl.assistant()

    state = run_ok(prog, backend)
    assert state.messages()[1:] == [{"role": "user", "content": "Say hi"},
                                    {"role": "assistant", "content": "Hello there\n\n"},
                                    {"role": "assistant", "content": ""}]
    assert state.text().endswith("<|im_start|>assistant\n<|im_end|>\n")


def test_separate_reasoning_splits_the_answer_from_the_thinking():
    reply = "<think>The capital is Paris.</think>\n\nParis"
    backend = FakeBackend({"assistant\n": reply}, chat_template=CHATML)

    @rl.function
    def prog(s):
        s += rl.user("Capital of France?")
        s += rl.assistant(rl.separate_reasoning(rl.gen("answer", max_tokens=64), model_type="qwen3"))

    state = run_ok(prog, backend)
    assert state["answer"] == "Paris"
    assert state["answer_reasoning_content"] == "The capital is Paris."
    assert state.messages()[-1] == {"role": "assistant", "content": "Paris"}
    assert state.text().endswith("<|im_start|>assistant\nParis<|im_end|>\n")

    streamed = prog.run(backend=backend, stream=True)
    assert "".join(streamed.text_iter("answer")) == reply  # what was streamed stays as it was sent
    assert streamed["answer"] == "Paris" and streamed["answer_reasoning_content"] == "The capital is Paris."

    no_thinking = FakeBackend({"assistant\n": "Paris"}, chat_template=CHATML)
    state = run_ok(prog, no_thinking)
    assert (state["answer"], state["answer_reasoning_content"]) == ("Paris", "")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        rl.separate_reasoning(rl.gen("a"), model_type="nope")
    with pytest.raises(ValueError, match="named gen"):
        rl.separate_reasoning(rl.gen(), model_type="qwen3")


def test_flush_cache_takes_sglangs_empty_cache_argument():
    assert rl.flush_cache(FakeBackend(), empty_cache=True) is False  # the fake refuses, as a busy server


def run_ok(program, backend):
    state = program.run(backend=backend)
    assert state.error() is None, state.error()
    return state
