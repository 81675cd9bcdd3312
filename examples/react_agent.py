"""A ReAct-style agent: the model thinks, picks an action with ``select``, and plain Python
branches on it, calling a (toy) tool and feeding the observation back.

    radixlm serve --port 30000
    python examples/react_agent.py --url http://127.0.0.1:30000
"""

import argparse

import radixlm.lang as rl

KNOWLEDGE = {"Kenya": "Nairobi is the capital of Kenya.", "Peru": "Lima is the capital of Peru.",
             "Japan": "Tokyo is the capital of Japan."}

EXAMPLE = ("Question: What is the capital of Peru?\n"
           "Thought: I do not know it, so I will search for Peru.\nAction: Search[Peru]\n"
           "Observation: Lima is the capital of Peru.\n"
           "Thought: The observation says Lima.\nAction: Finish[Lima]\n\n")


def search(topic: str) -> str:
    return KNOWLEDGE.get(topic.strip(), "No result.")


@rl.function
def react(s, question, max_steps):
    s += EXAMPLE + f"Question: {question}\n"
    for step in range(max_steps):
        s += "Thought:" + rl.gen(f"thought{step}", stop="\n", max_tokens=16) + "\nAction: "
        s += rl.select(f"action{step}", choices=["Search", "Finish"])
        s += "[" + rl.gen(f"arg{step}", stop="]", max_tokens=8) + "]\n"
        if s[f"action{step}"] == "Finish":  # reading a variable waits for it
            return s[f"arg{step}"].strip()
        s += "Observation: " + search(s[f"arg{step}"]) + "\n"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-steps", type=int, default=3)
    args = parser.parse_args()

    rl.set_default_backend(rl.RuntimeEndpoint(args.url))
    state = react.run(question="What is the capital of Kenya?", max_steps=args.max_steps, temperature=0)
    print(state.text()[len(EXAMPLE):])
    print("final answer:", state.ret_value)


if __name__ == "__main__":
    main()
