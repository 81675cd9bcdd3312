"""The ``radixlm`` console script.

``radixlm serve [server flags]`` runs the HTTP server (same flags as
``python -m radixlm.srt.launch_server``; with no ``--model-path`` it serves the SmolLM2 demo model).
``radixlm serve-ray --num-replicas N [server flags] [--ray-address ADDR]`` deploys N servers on a Ray
cluster behind Ray Serve's HTTP ingress (needs the ``ray`` extra).
``radixlm bench serving|one_batch|offline|grammar|suite [flags]`` runs a source checkout's
``benchmarks/`` script (``suite``: ``run_all.sh``, every workload against every installed peer).
``radixlm --version`` prints ``radixlm <version>`` (the installed distribution's).
Kept import-light: nothing heavy is imported until a subcommand runs.
"""

from __future__ import annotations

import sys
from typing import Optional

_USAGE = """usage: radixlm <command> [args]

commands:
  serve       start the HTTP server (radixlm serve --help for its flags)
  serve-ray   N servers on a Ray cluster behind Ray Serve (radixlm serve-ray --help)
  bench       benchmarks: radixlm bench serving --help (also one_batch, offline, grammar, suite)

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
    if command == "serve-ray":
        from radixlm.srt.ray_serve.cli import main as serve_ray_main

        return serve_ray_main(rest)
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


_BENCH_SCRIPTS = {"serving": "bench_serving.py", "one_batch": "bench_one_batch.py", "offline": "bench_offline.py",
                  "grammar": "bench_grammar.py", "suite": "run_all.sh"}


def _bench(args: list[str]) -> int:
    """``radixlm bench <name> [flags]`` -> ``benchmarks/<script>`` of the source checkout (not a package):
    ``serving`` runs bench_serving's ``main`` in this process; ``one_batch``, ``offline``, ``grammar``
    run their script with this Python; ``suite`` runs ``run_all.sh`` (configured by environment)."""
    import importlib.util
    import subprocess
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks"
    name = args[0] if args else ""
    if name not in _BENCH_SCRIPTS or not (bench_dir / _BENCH_SCRIPTS[name]).exists():
        print(f"usage: radixlm bench {{{'|'.join(_BENCH_SCRIPTS)}}} [flags] (needs a source checkout with "
              "benchmarks/)", file=sys.stderr)
        return 2
    script = bench_dir / _BENCH_SCRIPTS[name]
    if name == "suite":
        return subprocess.call(["bash", str(script), *args[1:]])
    if name != "serving":
        return subprocess.call([sys.executable, str(script), *args[1:]])
    spec = importlib.util.spec_from_file_location("_radixlm_bench_serving", script)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses need it there
    spec.loader.exec_module(module)
    module.main(args[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
