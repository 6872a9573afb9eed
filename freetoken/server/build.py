"""The engine, generation service and app that `freetoken serve` runs, built from its parsed
options (cli/serve.py parses them; tests and the Ray replicas call `build` too)."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .. import LLM
from ..default_model import DEMO_NAME, NAME as DEFAULT_NAME, choose, not_installed_hint
from ..engine.args import engine_options
from ..errors import FreeTokenError
from ..memory.watcher import MemoryWatcher, WatchPolicy, machine_free
from ..tiny import make_tiny
from ..weights.source import load_json_side_file, model_config
from ..weights.stores import resolve_model
from .app import create_app
from .guards.conn_timeouts import ConnTimeouts
from .generation import GenerationService
from .guards.keys import resolve_keys
from .server_state import ServerSettings

log = logging.getLogger("freetoken.server")

DEMO_ARCH = "qwen3_moe"
DEMO_CONTEXT = 131072     # agent prompts are 20-50k tokens with the demo's small vocabulary


def serve_options(args) -> dict:
    opts = engine_options(args)
    for kv in args.engine_option:
        k, _, v = kv.partition("=")
        try:
            opts[k.strip().replace("-", "_")] = json.loads(v)
        except ValueError:
            opts[k.strip().replace("-", "_")] = v
    opts["max_num_seqs"] = args.max_running_requests
    return {k: v for k, v in opts.items() if v is not None}


def demo_model_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "freetoken"
    return cache / f"demo-{DEMO_ARCH}-ctx{DEMO_CONTEXT}"


def ensure_demo_model() -> Path:
    d = demo_model_dir()
    if not (d / "config.json").is_file() or not (d / "tokenizer.json").is_file():
        log.warning("building the random-weight demo model in %s", d)
        make_tiny(DEMO_ARCH, d, dtype="float32", max_position_embeddings=DEMO_CONTEXT)
    return d


def architecture_of(model: str | Path) -> str | None:
    try:
        cfg = model_config(model)
    except (OSError, ValueError, FreeTokenError):
        return None
    archs = cfg.get("architectures") or []
    return archs[0] if archs else None


GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(model: str | Path) -> dict:
    """The checkpoint's recommended sampling (generation_config.json), for requests that
    leave a field out."""
    try:
        cfg = load_json_side_file(model, "generation_config.json")
    except (OSError, ValueError, FreeTokenError):
        return {}
    if not cfg:
        return {}
    if not isinstance(cfg, dict):
        return {}
    if cfg.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: cfg[k] for k in GENERATION_DEFAULTS if isinstance(cfg.get(k), (int, float))}


def build(args):
    """The engine, service and app for `serve` args (tests call this too)."""


    resolve_keys(args)
    # no --model: SmolLM2-135M-Instruct when installed, else the random MoE demo (also by name)
    model, kind = choose(args.model)
    if kind == "demo" and args.model is None:
        log.warning("%s: serving the random-weight demo instead", not_installed_hint())
    demo, default = kind == "demo", kind == "default"
    if not demo and not default:
        model = resolve_model(model)
    if demo:
        model = str(ensure_demo_model())
        if args.dtype == "bfloat16":
            args.dtype = "float32"
    opts = serve_options(args)
    if demo:
        opts.setdefault("max_model_len", DEMO_CONTEXT)
        opts.setdefault("kv_cache_gib", 0.5)
    llm = LLM(model, **opts)
    names = [n.strip() for n in (args.served_model_name or "").split(",") if n.strip()]
    if not names:
        path = Path(model).resolve()
        named = not demo and not default and not Path(args.model).expanduser().exists()   # Ollama/HF name
        names = ([DEMO_NAME] if demo else [DEFAULT_NAME] if default else [args.model] if named
                 else [path.stem if path.is_file() else path.name])
    svc = GenerationService(llm.engine, model_name=names[0], architecture=architecture_of(model),
                            max_running=args.max_running_requests,
                            max_waiting=args.max_waiting_requests,
                            max_tokens_cap=args.max_tokens_cap,
                            strict_max_tokens=args.strict_max_tokens,
                            sampling_defaults=sampling_defaults(model),
                            stall_timeout=args.stall_timeout)
    if svc.sampling_defaults:
        log.info("sampling defaults from generation_config.json: %s", svc.sampling_defaults)
    app = create_app(svc, ServerSettings(model_names=names, api_key=args.api_key,
                                   model_match=args.model_match,
                                   max_body_bytes=int(args.max_body_mb * (1 << 20)),
                                   admin_token=getattr(args, "admin_token", None),
                                   allowed_hosts=_csv(getattr(args, "allowed_hosts", "")),
                                   cors_origins=_csv(getattr(args, "cors_origins", "")),
                                   random_demo=demo))
    svc.loop.watcher = memory_watcher(args, llm.engine)
    svc.metrics.set_memory_sizes(llm.engine.memory_sizes())
    svc.metrics.memory_pinned.set(llm.engine.pinned_bytes())
    return llm, svc, app, demo, model


def conn_timeouts(args):
    try:
        return ConnTimeouts(header_s=args.header_timeout_s, body_s=args.body_timeout_s,
                            idle_s=args.idle_timeout_s)
    except ValueError as e:     # "header_s: ..." -> "--header-timeout-s: ..."
        field, _, why = str(e).partition(": ")
        raise SystemExit(f"freetoken serve: --{field[:-2]}-timeout-s: {why}") from None


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def memory_watcher(args, engine):
    """The free-memory watcher of `--memory-floor-gib`, growing back to the start-up sizes."""
    floor = getattr(args, "memory_floor_gib", None)
    if floor is None:
        return None
    try:
        policy = WatchPolicy.from_gib(floor, args.memory_ceiling_gib, args.memory_watch_interval)
    except ValueError as e:
        raise SystemExit(f"freetoken serve: {e}") from None
    planned = {c: s["bytes"] for c, s in engine.memory_sizes().items() if s is not None}
    device = engine.device.type
    log.info("memory watcher: give back below %.2f GiB free, grow back above %.2f GiB",
             policy.floor_bytes / 2**30, policy.ceiling_bytes / 2**30)
    return MemoryWatcher(policy, planned, lambda: machine_free(device))
