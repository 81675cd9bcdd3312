"""The ``radixlm`` console script.

``radixlm serve [server flags]`` runs the HTTP server (same flags as
``python -m radixlm.srt.launch_server``; with no ``--model-path`` it serves the SmolLM2 demo model).
``radixlm bench serving [flags]`` runs ``benchmarks/bench_serving.py`` (a source checkout's, loaded by path).
``radixlm --version`` prints ``radixlm <version>`` (the installed distribution's).
Kept import-light: nothing heavy is imported until a subcommand runs.
"""

from __future__ import annotations

import sys
from typing import Optional

_USAGE = """usage: radixlm <command> [args]

commands:
  serve   start the HTTP server (radixlm serve --help for its flags)
  bench   benchmark running servers: radixlm bench serving --help

options:
  --version  print the installed version and exit
"""


def main(argv: Optional[list[str]] = None) -> int:
    """Dispatch a subcommand; returns the process exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"radixlm {installed_version()}")
        return 0
    command, rest = args[0], args[1:]
    if command == "serve":
        from radixlm.srt.launch_server import main as serve_main

        return serve_main(rest, prog="radixlm serve")
    if command == "bench":
        return _bench(rest)
    print(f"radixlm: unknown command {command!r}\n\n{_USAGE}", file=sys.stderr, end="")
    return 2


def installed_version() -> str:
    """The version of the installed ``radixlm`` distribution (its metadata; ``radixlm.__version__``
    when the package runs from a checkout that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("radixlm")
    except PackageNotFoundError:
        from radixlm import __version__

        return __version__


def _bench(args: list[str]) -> int:
    """``radixlm bench serving ...`` -> ``benchmarks/bench_serving.py``'s ``main`` (not a package)."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_serving.py"
    if args[:1] != ["serving"] or not script.exists():
        print("usage: radixlm bench serving [flags] (needs a source checkout with benchmarks/)", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("_radixlm_bench_serving", script)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses need it there
    spec.loader.exec_module(module)
    module.main(args[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
