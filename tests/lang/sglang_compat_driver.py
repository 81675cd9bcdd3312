"""Run SGLang's own frontend (``import sglang``) against a radixlm server; print results as JSON.

Usage: python sglang_compat_driver.py URL [--regex]. Used by test_compat_sglang.py in a subprocess,
so sglang's imports and global state stay out of the test process.
"""

import json
import sys

import sglang as sgl

IPV4 = r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


@sgl.function
def few_shot_qa(s, question):
    s += "The following are questions with answers.\n\n"
    s += "Q: What is the capital of France?\nA: Paris\n"
    s += "Q: What is the capital of Germany?\nA: Berlin\n"
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", stop="\n", max_tokens=6)


@sgl.function
def multi_turn(s):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant(sgl.gen("a1", max_tokens=12))
    s += sgl.user("And of Italy?")
    s += sgl.assistant(sgl.gen("a2", max_tokens=12))


@sgl.function
def true_false(s):
    s += "Statement: Water is wet.\nAnswer: True\n\nStatement: The sky is blue.\nAnswer: "
    s += sgl.select("verdict", choices=["True", "False", "Unknown"])


@sgl.function
def fork_tips(s):
    s += "Here are two tips for sleeping well.\n"
    forks = s.fork(2)
    forks += lambda i: f"Tip {i + 1}:"
    forks += sgl.gen("tip", max_tokens=8)
    forks.join()


@sgl.function
def ip(s):
    s += "The IP address of the local host is " + sgl.gen("ip", regex=IPV4, max_tokens=16)


def main() -> None:
    url, with_regex = sys.argv[1], "--regex" in sys.argv
    sgl.set_default_backend(sgl.RuntimeEndpoint(url, chat_template_name="chatml"))
    out = {}
    state = few_shot_qa.run(question="What is the capital of Spain?", temperature=0)
    out["few_shot"] = state["answer"]
    state = multi_turn.run(temperature=0)
    out["messages"] = state.messages()
    state = true_false.run()
    out["select"] = state["verdict"]
    out["select_meta"] = state.get_meta_info("verdict")["normalized_prompt_logprobs"]
    state = fork_tips.run(temperature=0)
    out["fork"] = state["tip"]
    if with_regex:
        out["ip"] = ip.run(temperature=0)["ip"]
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
