"""Skeleton of thought with fork/join: list tips, expand each one in parallel branches that share
the prefix (prefilled once), then gather the branches' variables and summarize.

    radixlm serve --port 30000
    python examples/fork_join_tips.py --url http://127.0.0.1:30000
"""

import argparse

import radixlm.lang as rl


@rl.function
def tips(s, topic, num_tips, max_tokens):
    s += f"Here are {num_tips} short tips for {topic}.\n"
    for i in range(num_tips):
        s += f"{i + 1}." + rl.gen(f"tip{i}", max_tokens=max_tokens, stop=["\n", "."]) + ".\n"
    forks = s.fork(num_tips)
    # per-branch text: each branch expands its own tip
    forks += lambda i: f"\nTip {i + 1} ({s[f'tip{i}'].strip()}) explained in detail:"
    forks += rl.gen("detail", max_tokens=max_tokens, stop="\n\n")
    forks.join()  # s["detail"] is now the list of the branches' details
    s += "\nIn summary," + rl.gen("summary", max_tokens=max_tokens, stop="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()

    rl.set_default_backend(rl.RuntimeEndpoint(args.url))
    state = tips.run(topic="staying healthy", num_tips=3, max_tokens=args.max_tokens, temperature=0)
    for i, detail in enumerate(state["detail"]):
        print(f"tip {i + 1}: {state[f'tip{i}'].strip()}\n   -> {' '.join(detail.split())}")
    print("summary:", state["summary"].strip())
    print("branch cached_tokens:", [m["cached_tokens"] for m in state.get_meta_info("detail")])


if __name__ == "__main__":
    main()
