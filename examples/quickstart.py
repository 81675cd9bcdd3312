"""Quickstart: a prompt program with a gen and a select.

Launch a server (SmolLM2-135M-Instruct, the demo model), then run this file:

    radixlm serve --port 30000
    python examples/quickstart.py --url http://127.0.0.1:30000
"""

import argparse

import radixlm.lang as rl


@rl.function
def capital(s, country, max_tokens=24):
    s += rl.user(f"What is the capital of {country}?")
    s += rl.assistant(rl.gen("answer", max_tokens=max_tokens))
    s += rl.user("Is that city on the coast? Answer Yes or No.")
    s += rl.assistant(rl.select("coastal", choices=["Yes", "No"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()

    rl.set_default_backend(rl.RuntimeEndpoint(args.url))
    state = capital.run(country="France", max_tokens=args.max_tokens, temperature=0)
    print("answer: ", state["answer"])
    print("coastal:", state["coastal"], state.get_meta_info("coastal")["normalized_prompt_logprobs"])
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']}")


if __name__ == "__main__":
    main()
