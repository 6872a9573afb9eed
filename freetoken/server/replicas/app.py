"""`freetoken serve --replicas N`: the Ray Serve application (a front end and one engine
deployment of N replicas behind the prefix-aware router), started on a local Ray instance
or on the cluster `--ray-address` names."""
from __future__ import annotations

import copy
import logging
import os
import signal
import threading
from pathlib import Path

import freetoken

from ...config import EngineConfig
from ...weights.stores import resolve_model
from ..build import ensure_demo_model, serve_options
from .loopback import is_loopback_host, rerun_on_loopback

log = logging.getLogger("freetoken.replicas")

APP_NAME = "freetoken"
ENGINE_NAME = "engine"


def engine_block_size(args) -> int:
    return int(serve_options(args).get("kv_block_size") or EngineConfig.kv_block_size)


def build_application(args, *, routing: str = "prefix"):
    """The bound Serve application for `serve --replicas` args."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    # Ray is optional (pip install 'freetoken[ray]'): these modules import it
    from .engine_replica import EngineReplica
    from .frontend import Frontend
    from .router import ROUTERS

    if routing not in ROUTERS:
        raise SystemExit(f"freetoken serve: --routing must be one of {', '.join(ROUTERS)}, got {routing!r}")
    model_dir = args.model_dir
    args = copy.copy(args)
    if args.threads is None:          # torch would take every core of the node
        args.threads = max(1, int(args.replica_cpus))
    engine = serve.deployment(
        EngineReplica, name=ENGINE_NAME, num_replicas=args.replicas,
        ray_actor_options={"num_cpus": args.replica_cpus, "num_gpus": args.replica_gpus},
        max_ongoing_requests=args.max_running_requests + args.max_waiting_requests,
        health_check_period_s=2, health_check_timeout_s=30, graceful_shutdown_timeout_s=args.shutdown_timeout,
        request_router_config=RequestRouterConfig(request_router_class=f"{ROUTERS[routing].__module__}.{ROUTERS[routing].__name__}",
                                                  request_router_kwargs={"queue_bound": args.route_queue_bound}),
    ).bind(args)
    return Frontend.bind(engine, api_key=args.api_key, engine_name=ENGINE_NAME, model_dir=model_dir,
                         block_size=engine_block_size(args), replicas=args.replicas)


def package_root() -> str:
    """The folder holding the `freetoken` package this process runs (workers import it too)."""
    return str(Path(freetoken.__file__).resolve().parent.parent)


def _token_auth_if_token() -> None:
    """Join a cluster as `ray start --address` does: with token authentication when this
    machine has a Ray token and RAY_AUTH_MODE is unset (Ray 2.60 turns tokens on for a new
    cluster, but `ray.init(address=...)` would not send one). Ray's own function, the one
    `ray start` calls (ray[serve] is pinned)."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available)
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def start_ray(address: str | None, *, num_cpus: int | None = None, object_store_bytes: int | None = None,
              loopback: bool = False):
    """Join the cluster at `address`, or start a local instance; `loopback`: its node IP is
    127.0.0.1 (its ports stay on loopback when the process runs with the loopback shim,
    loopback.py)."""
    import ray
    env = {"PYTHONPATH": os.pathsep.join(p for p in (package_root(), os.environ.get("PYTHONPATH")) if p)}
    kw = {"runtime_env": {"env_vars": env}, "include_dashboard": False, "log_to_driver": True}
    if loopback and not address:
        kw["_node_ip_address"] = "127.0.0.1"
    if address:
        _token_auth_if_token()
        ray.init(address=address, **kw)
        return
    for attempt in range(3):      # Ray gives its raylet 30 s to register: not enough on a loaded box
        try:
            # "local": a new instance even where `ray start` left a cluster address behind
            # (ray.init() would join that one)
            ray.init(address="local", num_cpus=num_cpus, object_store_memory=object_store_bytes, **kw)
            return
        except Exception as e:  # noqa: BLE001 - only that timeout is retried
            if "timed out during startup" not in str(e) or attempt == 2:
                raise
            log.warning("the local Ray instance did not start in time (attempt %d): retrying", attempt + 1)
            ray.shutdown()


def resolve_model_dir(args) -> None:
    """The checkpoint every replica (and the front end's tokenizer) loads: built once here
    for the demo model."""
    if args.model is None:
        args.model_dir = str(ensure_demo_model())
    else:
        args.model_dir = str(resolve_model(args.model))


def cmd_serve_replicas(args) -> int:
    try:
        import ray  # noqa: F401
        from ray import serve
    except ImportError:
        raise SystemExit("freetoken serve --replicas needs Ray Serve: pip install 'freetoken[ray]'") from None
    if args.replicas < 1:
        raise SystemExit(f"freetoken serve: --replicas must be at least 1, got {args.replicas}")
    loopback = not args.ray_address and is_loopback_host(args.host)
    if loopback and getattr(args, "argv", None) is not None:
        rerun_on_loopback(args.argv)       # returns only in the re-run process
    resolve_model_dir(args)
    start_ray(args.ray_address, loopback=loopback)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_application(args, routing=args.routing), name=APP_NAME, route_prefix="/")
    url = f"http://{args.host}:{args.port}"
    log.warning("FreeToken ready on %s with %d engine replicas (%s routing)  (OpenAI base URL %s/v1, "
                "Anthropic base URL %s)", url, args.replicas, args.routing, url, url)
    print(f"READY {url}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.warning("stopping the replicas")
    serve.delete(APP_NAME)
    if not args.ray_address:
        serve.shutdown()
    ray.shutdown()
    return 0
