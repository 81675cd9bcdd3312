"""Ports of SGLang's frontend test programs (``test_programs.py``) adapted to SmolLM2-135M-Instruct,
run against a live server of the demo model: the programs where words must mean something."""

import json
import re

import radixlm.lang as rl

from .conftest import require_regex


@rl.function
def few_shot_qa(s, question):
    s += "The following are questions with answers.\n\n"
    s += "Q: What is the capital of France?\nA: Paris\n"
    s += "Q: What is the capital of Germany?\nA: Berlin\n"
    s += "Q: What is the capital of Italy?\nA: Rome\n"
    s += "Q: " + question + "\nA:"
    s += rl.gen("answer", stop="\n", max_tokens=6)


def test_few_shot_qa(smollm2):
    state = few_shot_qa.run(question="What is the capital of Spain?", backend=smollm2, temperature=0)
    assert "madrid" in state["answer"].lower()
    states = few_shot_qa.run_batch(
        [{"question": f"What is the capital of {c}?"} for c in ("Japan", "the United Kingdom", "China")],
        backend=smollm2, temperature=0.1, progress_bar=False)
    assert [s["answer"].strip().lower() for s in states] == ["tokyo", "london", "beijing"]


def test_multi_turn_chat_with_roles_reuses_previous_turns(smollm2):
    @rl.function
    def chat(s):
        s += rl.system("You are a helpful assistant. Answer in one short sentence.")
        s += rl.user("What is the capital of France?")
        s += rl.assistant(rl.gen("a1", max_tokens=12))
        with s.user():
            s += "And the capital of Italy?"
        with s.assistant():
            s += rl.gen("a2", max_tokens=12)
        s += rl.user("And of Spain?")
        s += rl.assistant(rl.gen("a3", max_tokens=12))

    state = chat.run(backend=smollm2, temperature=0)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant"] * 1 + ["user", "assistant"] * 2
    assert "paris" in state["a1"].lower() and "rome" in state["a2"].lower()
    assert "<|im_end|>" not in state["a1"]  # the template's stop string ended the turn
    metas = [state.get_meta_info(n) for n in ("a1", "a2", "a3")]
    for prev, cur in zip(metas, metas[1:]):
        # the previous turn's prompt and generated answer came from the radix tree
        assert cur["cached_tokens"] >= prev["prompt_tokens"] + prev["completion_tokens"] - 1


SHOTS = ("Statement: Water is wet.\nAnswer: True\n\nStatement: Cats can fly to the moon.\nAnswer: False\n\n"
         "Statement: It will rain in London on 3 May 2090.\nAnswer: Unknown\n\n")


def test_select_true_false_unknown(smollm2):
    @rl.function
    def judge(s, statement, method):
        s += SHOTS + "Statement: " + statement + "\nAnswer: "
        s += rl.select("verdict", choices=["True", "False", "Unknown"], choices_method=method)

    for method in (rl.token_length_normalized, rl.greedy_token_selection, rl.unconditional_likelihood_normalized):
        state = judge.run(statement="The sky is blue.", method=method, backend=smollm2)
        assert state["verdict"] == "True", method
    meta = state.get_meta_info("verdict")
    assert len(meta["normalized_prompt_logprobs"]) == 3
    # "Answer: " ends with a space that merges into the choice's first token (" True")
    assert [t[2] for t in meta["input_token_logprobs"][0]] == [" True"]


def test_expert_answer_reads_a_variable_back(smollm2):
    @rl.function
    def expert_answer(s, question):
        s += "Question: " + question + "\n"
        s += "A good person to answer this question is" + rl.gen("expert", stop=[".", "\n"], max_tokens=12) + ".\n"
        s += "For instance," + s["expert"] + " would answer that the capital of France is"
        s += rl.gen("answer", stop=".", max_tokens=10)

    state = expert_answer.run(question="What is the capital of France?", backend=smollm2, temperature=0)
    assert state["expert"].strip() and "paris" in state["answer"].lower()


def test_tool_use_evaluates_the_generated_expression(smollm2):
    @rl.function
    def tool_use(s, lhs, rhs):
        s += "Please perform computations using a calculator. You can use calc(expression) to get the results.\n"
        s += "For example,\ncalc(1 + 3) = 4\n"
        s += f"Question: what is the product of {lhs} and {rhs}?\n"
        s += "Answer: The answer is calc(" + rl.gen("expression", stop=")", max_tokens=12) + ") = "
        expression = s["expression"]
        if not re.fullmatch(r"[\d\s+\-*/()]+", expression):
            raise ValueError(f"not an arithmetic expression: {expression!r}")
        s += str(eval(expression))  # safe: digits and operators only
        return eval(expression)

    state = tool_use.run(lhs=257, rhs=983, backend=smollm2, temperature=0)
    assert state.ret_value == 257 * 983 and state.text().endswith(str(257 * 983))


def test_react_loop_branches_on_select(smollm2):
    observations = {"Kenya": "Nairobi is the capital of Kenya."}

    @rl.function
    def react(s, question):
        s += ("Question: What is the capital of Peru?\nThought: I do not know it, so I will search for Peru.\n"
              "Action: Search[Peru]\nObservation: Lima is the capital of Peru.\n"
              "Thought: The observation says Lima.\nAction: Finish[Lima]\n\n")
        s += f"Question: {question}\n"
        for step in range(3):
            s += "Thought:" + rl.gen(f"thought{step}", stop="\n", max_tokens=16) + "\nAction: "
            s += rl.select(f"action{step}", choices=["Search", "Finish"])
            s += "[" + rl.gen(f"arg{step}", stop="]", max_tokens=8) + "]\n"
            if s[f"action{step}"] == "Finish":  # plain Python branching on a generated value
                return s[f"arg{step}"]
            s += "Observation: " + observations.get(s[f"arg{step}"].strip(), "No result.") + "\n"
        return None

    state = react.run(question="What is the capital of Kenya?", backend=smollm2, temperature=0)
    assert state.error() is None
    assert [state["action0"], state["action1"]] == ["Search", "Finish"]
    assert state.ret_value.strip() == "Nairobi"


def test_skeleton_of_thought_fork_join(smollm2):
    @rl.function
    def tips(s, topic):
        s += f"Here are three short tips for {topic}:\n1. Eat vegetables.\n2. Sleep well.\n3. Walk daily.\n\n"
        forks = s.fork(3)
        forks += lambda i: f"Expand tip {i + 1} in one sentence:"
        forks += rl.gen("detail", max_tokens=10, stop="\n")
        forks.join()
        s += "Summary:" + rl.gen("summary", max_tokens=10, stop="\n")
        return forks

    state = tips.run(topic="staying healthy", backend=smollm2, temperature=0)
    assert state.error() is None and len(state["detail"]) == 3
    assert [f["detail"] for f in state.ret_value] == state["detail"]
    assert isinstance(state["summary"], str)


def test_int_and_typed_gens(smollm2):
    require_regex(smollm2)

    @rl.function
    def facts(s):
        s += "Q: How many minutes are in an hour?\nA: 60\n\nQ: How many days are in a week?\nA: 7\n\n"
        s += "Q: How many hours are in a day?\nA: " + rl.gen_int("hours", max_tokens=4)
        s += "\n\nQ: How many days are in a year?\nA: " + rl.gen_int("days", max_tokens=4)
        s += "\n\nQ: Is water wet? Answer True or False.\nA: " + rl.gen("wet", dtype=bool, max_tokens=3)

    state = facts.run(backend=smollm2, temperature=0)
    assert int(state["hours"]) == 24 and int(state["days"]) == 365 and state["wet"] in ("True", "False")


def test_json_by_regex(smollm2):
    require_regex(smollm2)
    from radixlm.lang.ir import REGEX_INT, REGEX_STR

    @rl.function
    def city(s):
        s += rl.user("Describe Paris as JSON with a name and a population.")
        with s.assistant():
            with s.var_scope("json"):
                s += '{\n  "name": ' + rl.gen("name", regex=REGEX_STR, max_tokens=8) + ",\n"
                s += '  "population": ' + rl.gen("population", regex=REGEX_INT, max_tokens=8, stop=[" ", "\n"]) + "\n}"

    state = city.run(backend=smollm2, temperature=0)
    obj = json.loads(state["json"])
    assert isinstance(obj["name"], str) and isinstance(obj["population"], int)
