"""Run prompt programs in-process, without a server: ``radixlm.lang.Engine`` wraps the offline
engine (loads the model into this process; torch is imported when it is built).

    python examples/offline_engine.py                      # the SmolLM2 demo model
    python examples/offline_engine.py --model-path PATH    # any HF folder or .gguf file
"""

import argparse

import radixlm.lang as rl


@rl.function
def continue_story(s, opening, max_tokens):
    s += opening
    forks = s.fork(2)
    forks += [" Suddenly,", " Later that day,"]
    forks += rl.gen("ending", max_tokens=max_tokens, stop="\n")
    forks.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    engine = rl.Engine(args.model_path, max_total_tokens=8000)
    try:
        state = continue_story.run(opening="Once upon a time, a little robot lived in a garden.",
                                   max_tokens=args.max_tokens, temperature=0, backend=engine)
        for ending in state["ending"]:
            print("-", ending.strip())
        # The engine can also be called directly, with /generate's request and response shapes.
        out = engine.generate(prompt="The garden was", sampling_params={"max_new_tokens": 8, "temperature": 0})
        print("direct:", out["text"], out["meta_info"]["cached_tokens"])
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
