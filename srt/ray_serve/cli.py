"""``radixlm serve-ray --num-replicas N [serve flags] [--ray-address ADDR]``: N radixlm replicas on a
Ray cluster behind Ray Serve's HTTP ingress (``app.py``), on ``--host`` / ``--port``.

Without ``--ray-address`` a local Ray is started (``ray.init`` with this machine's cores, or
N x ``--num-cpus-per-replica`` if that is more) and shut down at exit; with one (``auto``: the
cluster this machine joined with ``ray start``; or ``ray://HOST:10001``, ``HOST:6379``) the
application is deployed there and removed at exit, the cluster kept. Every other flag is a
``radixlm serve`` flag, passed to each replica's server (``--host`` / ``--port`` are the ingress's;
each replica binds a free loopback port on its node). Each replica's server gets
``--cpu-threads = --num-cpus-per-replica`` (at least 1) unless given, so replicas that share a
machine do not oversubscribe its cores. The model path must exist on every node that hosts a replica.

Exit status: 0 after SIGTERM / Ctrl-C (the application and, if local, Ray are shut down); 2 for bad
flags; 1 with one line ``radixlm: error: <reason>`` if it cannot start (Ray Serve not installed,
port taken, model missing, a replica failed to start).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import time
from typing import Any, Optional

from radixlm.srt.ray_serve.app import PREFIX_TREE_ACTOR, REPLICA_DEPLOYMENT, RayServeOptions
from radixlm.srt.launch_server import exit_process, parse_server_args
from radixlm.srt.server_args import ServerArgs
from radixlm.srt.stop_signals import StopDuringStartup, StopSignals, configure_launcher_logging

logger = logging.getLogger("radixlm.serve_ray")

APP_NAME = "radixlm"
_LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024  # requests and chunks are small; don't take 30% of RAM


def main(argv: Optional[list[str]] = None, prog: str = "radixlm serve-ray") -> int:
    """Parse the flags (errors exit 2), run until a signal, leave with the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=(
        "Deploy radixlm replicas on a Ray cluster behind Ray Serve's HTTP ingress, with prefix-cache-affinity "
        "routing. The other flags are radixlm serve's, given to every replica."))
    ray_flags = parser.add_argument_group("Ray Serve")
    ray_flags.add_argument("--num-replicas", type=int, default=1, help="radixlm replicas (default: 1)")
    ray_flags.add_argument("--ray-address", default=None, help=(
        "a running Ray cluster: 'auto' (the one this machine joined with `ray start`), HOST:6379 or "
        "ray://HOST:10001 (default: start a local Ray for this process)"))
    ray_flags.add_argument("--num-cpus-per-replica", type=float, default=1.0,
                           help="CPUs Ray reserves for each replica; also its --cpu-threads (default: 1)")
    ray_flags.add_argument("--num-gpus-per-replica", type=float, default=0.0,
                           help="GPUs Ray reserves for each replica (default: 0)")
    ray_flags.add_argument("--max-ongoing-requests-per-replica", type=int, default=256, help=(
        "requests Serve lets into one replica at a time; the rest wait in Serve (default: 256)"))
    args, ns = parse_server_args(parser, argv)
    if ns.num_replicas < 1:
        parser.error(f"--num-replicas must be >= 1, got {ns.num_replicas}")
    if not 0 < ns.num_cpus_per_replica < math.inf:
        parser.error(f"--num-cpus-per-replica must be > 0, got {ns.num_cpus_per_replica}")
    if not 0 <= ns.num_gpus_per_replica < math.inf:
        parser.error(f"--num-gpus-per-replica must be >= 0, got {ns.num_gpus_per_replica}")
    if ns.max_ongoing_requests_per_replica < 1:
        parser.error(f"--max-ongoing-requests-per-replica must be >= 1, got {ns.max_ongoing_requests_per_replica}")
    if args.nnodes > 1:
        parser.error("serve-ray replicas are single-node: drop --nnodes (use --tp-size within a replica)")
    options = RayServeOptions(num_replicas=ns.num_replicas, num_cpus_per_replica=ns.num_cpus_per_replica,
                              num_gpus_per_replica=ns.num_gpus_per_replica,
                              max_ongoing_requests=ns.max_ongoing_requests_per_replica)
    exit_process(serve_ray(args, options, ns.ray_address))


def replica_argv(args: ServerArgs, cpus_per_replica: float) -> list[str]:
    """The ``radixlm serve`` flags of every replica: each option that differs from its default, but
    not ``--host`` / ``--port`` (the ingress's); ``--cpu-threads`` from the CPU reservation if unset."""
    if args.cpu_threads is None:
        args = dataclasses.replace(args, cpu_threads=max(1, int(cpus_per_replica)))
    argv: list[str] = []
    for f in dataclasses.fields(ServerArgs):
        value = getattr(args, f.name)
        if f.name in ("host", "port") or value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        argv += [flag] if isinstance(value, bool) else [flag, str(value)]
    return argv


def serve_ray(args: ServerArgs, options: RayServeOptions, ray_address: Optional[str]) -> int:
    """Deploy, wait for SIGTERM / SIGINT, tear down; returns the exit status."""
    from radixlm.srt.launch_server import port_unavailable, startup_failed

    configure_launcher_logging(args.log_level)
    try:
        import ray
        from ray import serve
    except ImportError as e:
        return startup_failed(f"serve-ray needs Ray Serve ({e}): pip install 'radixlm[ray]'")
    problem = port_unavailable(args.host, args.port)
    if problem is not None:
        return startup_failed(problem)
    from radixlm.srt.model_loader import ModelLoadError, resolve_model_path

    try:  # fail fast on a missing model; a GGUF is converted once here, before the replicas read it
        resolve_model_path(args.model_path, cache_dir=args.cache_dir)
    except ModelLoadError as e:
        return startup_failed(str(e))

    signals = StopSignals()
    signals.install()
    try:
        _init_ray(ray, ray_address, options)
        signals.install()  # ray.init sets a SIGTERM handler of its own (sys.exit) in the driver
        configure_launcher_logging(args.log_level)  # and its own (JSON) root log format
        from radixlm.srt.ray_serve.app import build_app

        serve.start(http_options={"host": args.host, "port": args.port})
        app = build_app(replica_argv(args, options.num_cpus_per_replica), options)
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except Exception as e:  # noqa: BLE001 - Serve wraps a replica's failure in its own exceptions
            logger.error("the application failed to deploy:\n%s", e)
            lines = str(e).splitlines() or [repr(e)]
            first = next((ln for ln in lines if "radixlm server" in ln), lines[0])
            return startup_failed(f"a replica failed to start: {first}")
        signals.started = True
        logger.info("radixlm serve-ray: %d replica(s) listening on http://%s:%d", options.num_replicas,
                    args.host, args.port)
        while not signals.received:
            time.sleep(0.5)
        logger.info("stopping (signal %d)", signals.received[0])
        return 0
    except StopDuringStartup:
        logger.info("stopped by signal during startup")
        return 0
    finally:
        signals.started = True  # from here on a signal only records
        _teardown(ray, serve, local=ray_address is None)


def _init_ray(ray: Any, address: Optional[str], options: RayServeOptions) -> None:
    if address is not None:
        ray.init(address=address, log_to_driver=True)
        logger.info("connected to the Ray cluster at %s: %s", address, ray.cluster_resources())
        return
    from radixlm.srt.cpu_runtime import available_cores

    cpus = max(available_cores(), math.ceil(options.num_replicas * options.num_cpus_per_replica))
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=_LOCAL_OBJECT_STORE_BYTES,
             log_to_driver=True)
    logger.info("started a local Ray with %d CPUs", cpus)


def _teardown(ray: Any, serve: Any, local: bool) -> None:
    """Remove the application (its replicas stop their servers) and the router's prefix-tree actor;
    stop Ray if this process started it. Errors are logged, not raised: we are exiting."""
    if not ray.is_initialized():
        return
    try:
        serve.delete(APP_NAME)
    except Exception as e:  # noqa: BLE001
        logger.warning("could not delete the Serve application: %s", e)
    try:
        ray.kill(ray.get_actor(PREFIX_TREE_ACTOR, namespace=f"serve::{APP_NAME}::{REPLICA_DEPLOYMENT}"))
    except ValueError:
        pass  # never created (no request was routed)
    except Exception as e:  # noqa: BLE001
        logger.warning("could not remove the %s actor: %s", PREFIX_TREE_ACTOR, e)
    if local:
        serve.shutdown()
        ray.shutdown()
