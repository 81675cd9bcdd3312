"""The ``radixlm`` console script.

``radixlm serve [server flags]`` runs the HTTP server (same flags as
``python -m radixlm.srt.launch_server``; with no ``--model-path`` it serves the SmolLM2 demo model).
``radixlm bench ...`` is reserved for the benchmark client (not yet implemented).
Kept import-light: nothing heavy is imported until a subcommand runs.
"""

from __future__ import annotations

import sys
from typing import Optional

_USAGE = """usage: radixlm <command> [args]

commands:
  serve   start the HTTP server (radixlm serve --help for its flags)
  bench   benchmark a running server (not yet implemented)
"""


def main(argv: Optional[list[str]] = None) -> int:
    """Dispatch a subcommand; returns the process exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        from radixlm.srt.launch_server import main as serve_main

        return serve_main(rest, prog="radixlm serve")
    if command == "bench":
        print("radixlm bench: not yet implemented", file=sys.stderr)
        return 2
    print(f"radixlm: unknown command {command!r}\n\n{_USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
