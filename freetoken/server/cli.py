"""`freetoken serve` and `freetoken launch`; `register(subparsers)` is called by freetoken.cli."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("freetoken.server")

DEMO_ARCH = "qwen3_moe"
DEMO_CONTEXT = 131072     # agent prompts are 20-50k tokens with the demo's small vocabulary


def _engine_args(p: argparse.ArgumentParser) -> None:
    from freetoken.cli import add_engine_args
    add_engine_args(p)
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other engine option (see freetoken/config.py), e.g. kv_cache_gib=2")


def _engine_options(args) -> dict:
    from freetoken.cli import engine_options
    opts = engine_options(args)
    for kv in args.engine_option:
        k, _, v = kv.partition("=")
        try:
            opts[k.strip().replace("-", "_")] = json.loads(v)
        except ValueError:
            opts[k.strip().replace("-", "_")] = v
    opts["max_num_seqs"] = args.max_running_requests
    return {k: v for k, v in opts.items() if v is not None}


def register(subparsers) -> None:
    s = subparsers.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server",
                              description="Serve a model over OpenAI (/v1/chat/completions, "
                              "/v1/completions, /v1/responses, /v1/models) and Anthropic "
                              "(/v1/messages) APIs. Without --model: a random-weight demo model.")
    s.add_argument("--model", default=None, help="checkpoint directory or FTW file (default: random-weight demo)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", default=None,
                   help="model id(s) clients use, comma-separated; the first is the main one")
    s.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer or x-api-key) on every route but "
                   "/health; visible in ps: prefer --api-key-file or $FREETOKEN_API_KEY")
    s.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="read the API key from this file (one line) instead (default: "
                   "$FREETOKEN_API_KEY, else no key)")
    s.add_argument("--max-running-requests", type=int, default=16,
                   help="requests decoded together by the engine")
    s.add_argument("--max-waiting-requests", type=int, default=256,
                   help="queued requests beyond that get 429 with Retry-After")
    s.add_argument("--model-match", default="auto", choices=["auto", "strict", "any"],
                   help="unknown model ids: auto = 404 on OpenAI routes, mapped to the served "
                   "model on Anthropic routes (claude-*); strict = 404 everywhere; any = map all")
    s.add_argument("--max-tokens-cap", type=int, default=None,
                   help="upper bound on any request's output tokens")
    s.add_argument("--strict-max-tokens", action="store_true",
                   help="reject max_tokens above the room left in the context window (default: "
                   "lower it to fit, as agents send 32k-128k)")
    s.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, let running requests finish for this many seconds; "
                   "the rest end with a 503 error event (default 30)")
    s.add_argument("--stall-timeout", type=float, default=30.0,
                   help="abort a request whose client has read none of its output for this many "
                   "seconds (default 30)")
    s.add_argument("--allowed-hosts", default="",
                   help="comma-separated Host names to answer besides loopback names and IP "
                   "addresses ('*' = any); other Host headers get 403 (DNS rebinding)")
    s.add_argument("--cors-origins", default="",
                   help="comma-separated web origins (https://app.example) allowed to call the "
                   "server from a browser; default none: CORS off, requests with another "
                   "Origin get 403")
    s.add_argument("--header-timeout-s", type=float, default=10.0,
                   help="close a connection whose request line and headers are not complete this "
                   "many seconds after its first byte (408; slowloris) (default 10)")
    s.add_argument("--body-timeout-s", type=float, default=60.0,
                   help="close a connection whose request body is not complete this many seconds "
                   "after its headers (default 60)")
    s.add_argument("--idle-timeout-s", type=float, default=5.0,
                   help="close a connection that sends nothing for this many seconds, after "
                   "connecting or between two requests (keep-alive) (default 5)")
    s.add_argument("--max-body-mb", type=float, default=32,
                   help="largest request body accepted; bigger ones get 413 (default 32)")
    s.add_argument("--admin-token", default=None,
                   help="enable GET/POST /admin/memory (runtime resizing) for requests carrying this "
                   "token as 'x-admin-token' or 'Authorization: Bearer' (default: off; "
                   "$FREETOKEN_ADMIN_TOKEN); visible in ps: prefer --admin-token-file")
    s.add_argument("--admin-token-file", default=None, metavar="PATH",
                   help="read the admin token from this file (one line) instead")
    s.add_argument("--memory-floor-gib", type=float, default=None,
                   help="watch free memory (host MemAvailable/cgroup, CUDA free): below this many GiB "
                   "give memory back (expert cache, then checkpoints, then unused KV blocks); "
                   "default: no watcher")
    s.add_argument("--memory-ceiling-gib", type=float, default=None,
                   help="grow back toward the start-up plan only while more than this is free "
                   "(default: 1.5 x floor + 0.25)")
    s.add_argument("--memory-watch-interval", type=float, default=5.0,
                   help="seconds between two watcher resizes at least (default 5)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _replica_args(s)
    _engine_args(s)
    s.set_defaults(func=cmd_serve)

    # one parser, launch_parser(), reads every option and prints the help (`freetoken launch
    # --help` shows one options section); this entry only hands it the rest of the line
    la = subparsers.add_parser("launch", add_help=False, prefix_chars="\0",
                               help="configure and start an agent CLI against a running server")
    la.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    la.set_defaults(func=cmd_launch)


def _replica_args(s) -> None:
    g = s.add_argument_group("replicas on Ray Serve (pip install 'freetoken[ray]'; docs/distributed.md)")
    g.add_argument("--replicas", type=int, default=None,
                   help="serve N engine replicas (each its own process and memory plan) behind one "
                   "prefix-aware router")
    g.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (HOST:PORT, or 'auto': the one 'ray start' started on this node), "
                   "with this machine's Ray token if it has one; default: start a new local Ray instance")
    g.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs each replica asks Ray for (default 1)")
    g.add_argument("--replica-gpus", type=float, default=0.0, help="GPUs each replica asks Ray for (default 0)")
    g.add_argument("--route-queue-bound", type=int, default=2,
                   help="a request that continues no session goes to its longest-prefix replica "
                   "unless that replica has more than this many requests in flight beyond the least "
                   "loaded one (default 2); a session's requests stay on its replica")
    g.add_argument("--routing", default="prefix", choices=["prefix", "round-robin"],
                   help="replica choice: prefix (default) or round-robin (for comparison)")


def demo_model_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "freetoken"
    return cache / f"demo-{DEMO_ARCH}-ctx{DEMO_CONTEXT}"


def ensure_demo_model() -> Path:
    d = demo_model_dir()
    if not (d / "config.json").is_file() or not (d / "tokenizer.json").is_file():
        from freetoken.tiny import make_tiny
        log.warning("building the random-weight demo model in %s", d)
        make_tiny(DEMO_ARCH, d, dtype="float32", max_position_embeddings=DEMO_CONTEXT)
    return d


def architecture_of(model: str | Path) -> str | None:
    from freetoken.errors import FreeTokenError
    from freetoken.weights.source import model_config
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
    from freetoken.errors import FreeTokenError
    from freetoken.weights.source import load_json_side_file
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
    from freetoken import LLM

    from .app import create_app
    from .generation import GenerationService
    from .server_state import Settings

    from freetoken.weights.stores import resolve_model
    from .keys import resolve_keys
    resolve_keys(args)
    model = args.model
    demo = model is None
    if not demo:
        model = resolve_model(model)
    if demo:
        model = str(ensure_demo_model())
        if args.dtype == "bfloat16":
            args.dtype = "float32"
    opts = _engine_options(args)
    if demo:
        opts.setdefault("max_model_len", DEMO_CONTEXT)
        opts.setdefault("kv_cache_gib", 0.5)
    llm = LLM(model, **opts)
    names = [n.strip() for n in (args.served_model_name or "").split(",") if n.strip()]
    if not names:
        path = Path(model).resolve()
        named = not demo and not Path(args.model).expanduser().exists()   # an Ollama name or HF repo id
        names = (["freetoken-demo"] if demo else [args.model] if named
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
    app = create_app(svc, Settings(model_names=names, api_key=args.api_key,
                                   model_match=args.model_match,
                                   max_body_bytes=int(args.max_body_mb * (1 << 20)),
                                   admin_token=getattr(args, "admin_token", None),
                                   allowed_hosts=_csv(getattr(args, "allowed_hosts", "")),
                                   cors_origins=_csv(getattr(args, "cors_origins", ""))))
    svc.loop.watcher = memory_watcher(args, llm.engine)
    svc.metrics.set_memory_sizes(llm.engine.memory_sizes())
    svc.metrics.memory_pinned.set(llm.engine.pinned_bytes())
    return llm, svc, app, demo, model


def conn_timeouts(args):
    from .conn_timeouts import ConnTimeouts
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
    from freetoken.memory.watcher import MemoryWatcher, WatchPolicy, machine_free
    try:
        policy = WatchPolicy.from_gib(floor, args.memory_ceiling_gib, args.memory_watch_interval)
    except ValueError as e:
        raise SystemExit(f"freetoken serve: {e}") from None
    planned = {c: s["bytes"] for c, s in engine.memory_sizes().items() if s is not None}
    device = engine.device.type
    log.info("memory watcher: give back below %.2f GiB free, grow back above %.2f GiB",
             policy.floor_bytes / 2**30, policy.ceiling_bytes / 2**30)
    return MemoryWatcher(policy, planned, lambda: machine_free(device))


def cmd_serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("freetoken").setLevel(args.log_level.upper())
    from .keys import resolve_keys
    resolve_keys(args)
    from .shutdown import bind_listener
    sock = bind_listener(args.host, args.port)      # before the model loads: a busy port fails now
    if getattr(args, "replicas", None) is not None:
        sock.close()                                # the replicas' front end binds its own
        from .replicas.app import cmd_serve_replicas
        return cmd_serve_replicas(args)
    try:
        llm, svc, app, demo, model = build(args)
    except BaseException:
        sock.close()
        raise
    try:
        svc.grammar_tokenizer()   # now, not on the first json_schema request (it holds the GIL)
    except Exception as e:  # noqa: BLE001 - constrained output is optional
        log.info("constrained output unavailable: %s", e)
    if demo:
        log.warning("NO --model GIVEN: serving a RANDOM-WEIGHT DEMO model (%s, built in %s). "
                    "Its output is gibberish; pass --model DIR to serve a real checkpoint.",
                    DEMO_ARCH, model)

    from .shutdown import GracefulServer, uvicorn_config

    class Server(GracefulServer):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.should_exit:
                return
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else args.port
            url = f"http://{args.host}:{port}"
            log.warning("FreeToken ready on %s  model=%s%s  (OpenAI base URL %s/v1, Anthropic base "
                        "URL %s)", url, svc.model_name, " [random-weight demo]" if demo else "",
                        url, url)
            print(f"READY {url}", flush=True)

    config = uvicorn_config(app, args.shutdown_timeout, conn_timeouts(args),
                            lambda phase: svc.metrics.conn_timeouts.labels(phase).inc(),
                            host=args.host, port=args.port,
                            log_level=args.log_level, access_log=args.log_level == "debug")
    server = Server(config, svc, args.shutdown_timeout)
    try:
        server.run(sockets=[sock])
    finally:
        llm.close()
    log.warning("FreeToken server stopped")
    return 0


def launch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="freetoken launch",
        usage="freetoken launch {claude,opencode,openclaw} [--server URL] [--model ID] "
              "[--api-key KEY] [--config-dir DIR] [--skip-window-check] [--dry-run] "
              "[-- AGENT ARGS...]",
        description="Write the agent's provider configuration for a running FreeToken server and "
                    "start the agent with it. Arguments after -- go to the agent. The user's own "
                    "agent files are never written.")
    p.add_argument("agent", choices=["claude", "opencode", "openclaw"])
    p.add_argument("--server", default="http://127.0.0.1:8000", help="the FreeToken server URL")
    p.add_argument("--model", default=None, help="model id (default: the server's first model)")
    p.add_argument("--api-key", default=os.environ.get("FREETOKEN_API_KEY"))
    p.add_argument("--config-dir", default=None, help="where to write the agent config "
                   "(default: ~/.config/freetoken/agents)")
    p.add_argument("--skip-window-check", action="store_true",
                   help="start the agent without first measuring whether the server's window holds "
                   "its first request (system prompt + tools), a reply and compaction headroom")
    p.add_argument("--dry-run", action="store_true", help="print the config and command; run nothing")
    return p


def cmd_launch(args) -> int:
    from .launch import launch
    rest = list(args.rest)
    agent_args = []
    if "--" in rest:
        i = rest.index("--")
        rest, agent_args = rest[:i], rest[i + 1:]
    largs = launch_parser().parse_args(rest)
    largs.agent_args = agent_args
    return launch(largs)


def main(argv: list[str] | None = None) -> int:
    """`python -m freetoken.server.cli serve ...` (the same as `freetoken serve ...`)."""
    p = argparse.ArgumentParser(prog="freetoken")
    register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
