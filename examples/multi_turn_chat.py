"""Multi-turn chat: each turn re-sends the whole conversation and the server's radix cache serves
the earlier turns, generated answers included (see ``cached_tokens``).

    radixlm serve --port 30000
    python examples/multi_turn_chat.py --url http://127.0.0.1:30000
"""

import argparse

import radixlm.lang as rl


@rl.function
def chat(s, questions, max_tokens):
    s += rl.system("You are a helpful assistant. Answer in one sentence.")
    for i, question in enumerate(questions):
        with s.user():
            s += question
        with s.assistant():
            s += rl.gen(f"answer{i}", max_tokens=max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    rl.set_default_backend(rl.RuntimeEndpoint(args.url))
    questions = ["What is the capital of France?", "What is it famous for?", "Name one museum there."]
    state = chat.run(questions=questions, max_tokens=args.max_tokens, temperature=0)
    for i, question in enumerate(questions):
        meta = state.get_meta_info(f"answer{i}")
        print(f"user:      {question}")
        print(f"assistant: {state[f'answer{i}'].strip()}")
        print(f"           (prompt {meta['prompt_tokens']} tokens, {meta['cached_tokens']} from the cache)")
    assert len(state.messages()) == 1 + 2 * len(questions)


if __name__ == "__main__":
    main()
