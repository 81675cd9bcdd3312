"""``python -m radixlm.srt.launch_server [SGLang-style flags]``: start the whole server (DESIGN.md section 2).

Order: resolve the model in this process (a GGUF is converted once, here), start the detokenizer and
scheduler processes (multiprocessing *spawn*), wait until both report ready, then open the port
(uvicorn + FastAPI + TokenizerManager on one asyncio loop). A startup failure with a known cause (port
in use, missing or corrupt model, unwritable cache, a child's setup error) is one stderr line
``radixlm: error: <reason>`` and exit status 1. A watchdog polls the children: if one
dies, its error goes to the log, waiting requests fail with 503 and the server exits with status 1.
SIGTERM / Ctrl-C drain the open requests (new ones get 503; ``srt/graceful_shutdown.py``; a second
signal or ``--shutdown-timeout`` cuts it short), then stop uvicorn, then the children (SIGTERM,
SIGKILL after ``_CHILD_STOP_S``), and remove the IPC directory; exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import Any, Optional

from radixlm.srt.server_args import ServerArgs, ServerArgsError

logger = logging.getLogger("radixlm.launch_server")

_GRACEFUL_SHUTDOWN_S = 2
_CHILD_STOP_S = 5.0
_WATCHDOG_S = 0.5


class _Stop(BaseException):
    """Raised by the SIGTERM/SIGINT handler while the server is starting."""


@dataclasses.dataclass
class _Child:
    name: str
    process: Any  # multiprocessing.Process
    pipe: Any  # receiving end of its ready/error pipe

    def error_text(self) -> str:
        """The child's ``error: <traceback>`` message if it sent one, else its exit status."""
        try:
            if self.pipe.poll():
                msg = self.pipe.recv()
                if isinstance(msg, str) and msg.startswith("error: "):
                    return msg[len("error: "):]
        except (EOFError, OSError):
            pass
        return f"(no traceback; exit code {self.process.exitcode})"


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """Parse ``ServerArgs`` flags (unknown flags are errors, exit 2), run the server, then leave the
    process with its status at once: every child is already stopped, and interpreter teardown
    (unloading torch) would take seconds during which a second signal kills us with -15."""
    parser = argparse.ArgumentParser(prog=prog or "python -m radixlm.srt.launch_server",
                                     description="Serve a model over HTTP (SGLang's native API).")
    args, _ = parse_server_args(parser, argv)
    exit_process(launch_server(args))


def parse_server_args(parser: argparse.ArgumentParser, argv: Optional[list[str]]
                      ) -> tuple[ServerArgs, argparse.Namespace]:
    """Add the ``ServerArgs`` flags to ``parser`` (which may hold flags of its own), parse ``argv``
    and build the ``ServerArgs``; returns them with the namespace (for the caller's own flags). A bad
    flag or value is ``parser.error`` (usage, exit 2)."""
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    try:
        return ServerArgs.from_cli_args(ns), ns
    except ServerArgsError as e:
        parser.error(str(e))


def exit_process(code: int) -> None:
    """Flush the logs and streams and leave the process with ``code`` at once: the children are
    already stopped, and interpreter teardown (unloading torch) takes seconds in which a second
    signal would kill the process with -15."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_server(args: ServerArgs) -> int:
    """Run until SIGTERM/SIGINT (returns 0) or until a process fails (returns 1)."""
    if args.node_rank > 0:  # another node of a multi-node TP group: its scheduler ranks only
        from radixlm.srt.worker_node import launch_worker_node

        return launch_worker_node(args)
    logging.basicConfig(level=args.log_level.upper(), force=True,
                        format="[%(asctime)s %(processName)s] %(levelname)s %(name)s: %(message)s")
    stopping: list[int] = []
    serving = [False]

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)
        if not serving[0]:
            raise _Stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    problem = port_unavailable(args.host, args.port) or _chat_template_unreadable(args.chat_template)
    if problem is not None:
        return startup_failed(problem)  # before loading anything: fail in a second, not a minute
    children: list[_Child] = []
    paths = None
    try:
        from radixlm.managers.ipc import IpcPaths
        from radixlm.srt.model_config import ModelConfig
        from radixlm.srt.model_loader import load_tokenizer, resolve_model_path

        resolved = resolve_model_path(args.model_path, cache_dir=args.cache_dir)
        paths = IpcPaths.in_new_tempdir()
        logger.info("IPC sockets in %s", paths.root)
        from radixlm.srt.model_config import context_length_problem

        problem = context_length_problem(resolved, args.context_length)
        if problem is not None:  # before any process starts: fail in a second
            return startup_failed(problem)
        # Children first: their imports and model load then overlap this process's config and
        # tokenizer load instead of waiting for it (a start is mostly CPU-bound imports).
        children = _start_children(args, resolved, paths)
        model_config = ModelConfig.from_path(resolved, dtype=args.model_dtype(), context_length=args.context_length,
                                             device=args.device, cache_dir=args.cache_dir)
        tokenizer = load_tokenizer(resolved, args.tokenizer_path, cache_dir=args.cache_dir)
        _import_serving_modules(args)
        if args.nnodes > 1:
            logger.info("waiting for %d more node(s) to join at %s", args.nnodes - 1, args.dist_init_addr)
        if not _wait_ready(children):
            return 1
        serving[0] = True
        with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
            return runner.run(_serve(args, children, tokenizer, model_config, paths, stopping))
    except _Stop:
        logger.info("stopped by signal during startup")
        return 0
    except Exception as exc:
        from radixlm.srt.model_loader import ModelLoadError

        if stopping:  # _Stop raised inside an import or a loader that wrapped it into its own error
            logger.info("stopped by signal during startup")
            return 0

        if isinstance(exc, ModelLoadError):  # a missing or corrupt model, an unwritable cache
            return startup_failed(str(exc))
        logger.exception("server failed to start")
        return 1
    finally:
        serving[0] = True  # from here on a signal only records
        _stop_children(children)
        if paths is not None:
            paths.remove()


def startup_failed(reason: str) -> int:
    """Print ``radixlm: error: <reason>`` as one line on stderr (no traceback: the reason names the
    path or option at fault); returns the exit status 1."""
    print(f"radixlm: error: {' '.join(reason.split())}", file=sys.stderr, flush=True)
    return 1


def _start_children(args: ServerArgs, resolved: str, paths: Any) -> list[_Child]:
    """The detokenizer (when ``paths``: node 0) and this node's scheduler ranks."""
    from radixlm.managers.detokenizer_manager import run_detokenizer_process
    from radixlm.managers.scheduler_process import run_scheduler_process
    from radixlm.srt.multinode import node_tp_ranks

    from radixlm.srt.cpu_runtime import openmp_env
    from radixlm.srt.dp_launch import scheduler_specs

    ctx = multiprocessing.get_context("spawn")
    # Spawned children inherit the environment; OpenMP reads it when torch loads there.
    os.environ.update(openmp_env())
    from radixlm.srt.model_runner import resolve_device
    from radixlm.srt.quantization import resolve_quantization

    # The schedulers get the converted folder: what --quantization's default means is decided on the
    # path the user gave (a .gguf keeps its blocks).
    try:
        quantization = resolve_quantization(args.quantization_method(), args.model_path, resolve_device(args.device))
    except (ValueError, RuntimeError) as exc:  # e.g. --quantization gguf for a folder: a one-line startup error
        from radixlm.srt.model_loader import ModelLoadError

        raise ModelLoadError(str(exc)) from exc
    child_args = dataclasses.replace(args, model_path=resolved, quantization=quantization)
    specs = [("detokenizer", run_detokenizer_process, (args.tokenizer_path or resolved, paths))] if paths else []
    # One scheduler per tensor-parallel rank of each data-parallel replica on this node; rank 0 of a
    # replica owns its sockets (DESIGN.md section 2).
    specs += scheduler_specs(child_args, paths, run_scheduler_process,
                             tp_ranks=node_tp_ranks(args.tp_size, args.nnodes, args.node_rank))
    children = []
    for name, target, target_args in specs:
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=target, args=(*target_args, writer), name=f"radixlm-{name}", daemon=True)
        proc.start()
        writer.close()  # the child holds the only writer, so its death shows as EOF
        children.append(_Child(name, proc, reader))
        logger.info("started %s process (pid %d)", name, proc.pid)
    return children


def _import_serving_modules(args: ServerArgs) -> None:
    """Import what ``_serve`` needs (uvicorn, the FastAPI app, the grammar library the tool-call
    validator checks tags with) while the children start, rather than after they are ready."""
    import uvicorn  # noqa: F401

    import radixlm.managers.tokenizer_manager  # noqa: F401
    import radixlm.srt.http_server  # noqa: F401

    if args.grammar_backend == "xgrammar":
        import xgrammar  # noqa: F401


def _wait_ready(children: list[_Child]) -> bool:
    """Block until every child sent ``ready``; False (after logging why) if one failed first."""
    pending = list(children)
    while pending:
        for child in list(pending):
            try:
                msg = child.pipe.recv() if child.pipe.poll(0.1) else None
            except EOFError:  # the child closed its end without a word: it is exiting
                child.process.join(2.0)
                msg = f"error: (exited before ready; exit code {child.process.exitcode})"
            if msg == "ready":
                logger.info("%s process ready", child.name)
                pending.remove(child)
            elif isinstance(msg, str):
                startup_failed(f"{child.name} process failed to start: {msg.removeprefix('error: ')}")
                return False
            elif not child.process.is_alive():
                startup_failed(f"{child.name} process exited during startup (exit code {child.process.exitcode})")
                return False
    return True


async def _serve(args: ServerArgs, children: list[_Child], tokenizer: Any, model_config: Any, paths: Any,
                 stopping: list[int]) -> int:
    import uvicorn

    from radixlm import __version__
    from radixlm.managers.tokenizer_manager import TokenizerManager
    from radixlm.srt.http_server import create_app
    from radixlm.srt.metrics import ServerMetrics

    from radixlm.srt.cpu_runtime import cpu_info

    cpu = cpu_info()
    logger.info("model dtype %s (--dtype %s); CPU %r with %s, %d cores", model_config.dtype, args.dtype,
                cpu.model, ",".join(cpu.flags) or "no relevant flags", cpu.cores)
    hf = model_config.hf_config
    model_info = {"model_path": args.model_path or model_config.model_path,
                  "tokenizer_path": args.tokenizer_path or model_config.model_path,
                  "served_model_name": args.served_model_name or args.model_path or DEMO_MODEL_NAME,
                  "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                  "has_image_understanding": False, "model_type": getattr(hf, "model_type", None),
                  "architectures": list(getattr(hf, "architectures", None) or [model_config.architecture]),
                  "context_length": model_config.context_len,
                  "dtype": str(model_config.dtype).removeprefix("torch."),
                  # The Jinja chat template the server renders /v1/chat/completions with (None if the
                  # model has none), so remote frontends format roles the same way.
                  "chat_template": _chat_template_text(args, tokenizer)}
    metrics = ServerMetrics(str(model_info["served_model_name"]), dp_size=args.dp_size)
    tm = TokenizerManager(args, tokenizer, model_config.vocab_size, model_config.context_len, paths, metrics)
    tm.start()
    app = create_app(tm, args, model_info, metrics, __version__)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None, log_level=args.log_level,
                            access_log=args.log_level == "debug", timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S)
    from radixlm.srt.graceful_shutdown import Drain, DrainingServer

    server = DrainingServer(config, stopping)
    exit_code = [0]
    drain = Drain(server, tm, args.shutdown_timeout)
    watchdog = asyncio.create_task(_watchdog(children, server, tm, exit_code, stopping, drain))
    try:
        logger.info("radixlm server listening on http://%s:%d", args.host, args.port)
        await server.serve()
    finally:
        watchdog.cancel()
        tm.close()
    if not server.started and exit_code[0] == 0:
        return 1  # uvicorn could not start (e.g. the port is taken); it logged why
    return exit_code[0]


def _event_loop_factory() -> Any:
    """uvloop's event loop (libuv; what uvicorn picks itself and SGLang's HTTP server runs on) when it is
    installed, else asyncio's default: the HTTP process wakes a request's stream for every token, and on
    the 2-core machines it shares the cores with the scheduler."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _watchdog(children: list[_Child], server: Any, tm: Any, exit_code: list[int], stopping: list[int],
                    drain: Any) -> None:
    """If a child dies: log its error, fail waiting requests, stop the server with status 1. Drives
    the drain after SIGTERM / SIGINT (``drain``; a signal before uvicorn installed its handlers
    counts too), and once the server is stopping ends what is still open at once (503), so open
    streams do not hold it up."""
    while True:
        await asyncio.sleep(_WATCHDOG_S)
        drain.poll(len(stopping), time.monotonic())
        if server.should_exit:
            if tm.dead is None:
                tm.fail_all("the server is shutting down")
            continue
        for child in children:
            if child.process.is_alive():
                continue
            reason = f"the {child.name} process died (exit code {child.process.exitcode})"
            logger.error("%s; shutting down. Its error:\n%s", reason, child.error_text())
            tm.fail_all(reason)
            exit_code[0] = 1
            server.should_exit = True
            return


def _stop_children(children: list[_Child]) -> None:
    """SIGTERM every live child, SIGKILL whatever is still alive after ``_CHILD_STOP_S``."""
    if children:
        logger.info("stopping %s", ", ".join(f"{c.name} (pid {c.process.pid})" for c in children))
    for child in children:
        if child.process.is_alive():
            child.process.terminate()
    deadline = time.monotonic() + _CHILD_STOP_S
    for child in children:
        child.process.join(max(0.0, deadline - time.monotonic()))
        if child.process.is_alive():
            logger.warning("%s process did not stop in %.0f s; killing it", child.name, _CHILD_STOP_S)
            child.process.kill()
            child.process.join(2.0)
        child.pipe.close()
    if children:
        logger.info("all processes stopped")


DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"  # what a server started without --model-path reports


def port_unavailable(host: str, port: int) -> Optional[str]:
    """A one-line reason when ``host:port`` cannot be bound (in use, no permission), else None."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as e:
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


def _chat_template_unreadable(path: Optional[str]) -> Optional[str]:
    """A one-line reason when the ``--chat-template`` file cannot be read, else None."""
    if path is None:
        return None
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            f.read(1)
    except (OSError, UnicodeDecodeError) as e:
        return f"--chat-template {path}: {getattr(e, 'strerror', None) or e}"
    return None


def _chat_template_text(args: ServerArgs, tokenizer: Any) -> Optional[str]:
    if args.chat_template:
        try:
            with open(args.chat_template, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None  # the chat route reports the unreadable file
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else None


if __name__ == "__main__":
    sys.exit(main())
