"""`freetoken serve` and `freetoken launch`: their flags, and the runs (the server's assembly
is server/build.py, the agent launcher cli/launch.py)."""
from __future__ import annotations

import argparse
import logging
import os

from ..engine.args import add_engine_args

log = logging.getLogger("freetoken.server")


MAIN_ENGINE_HELP = {
    "dtype": "weights/KV storage precision of float checkpoints (default bfloat16; GGUF quantized "
             "layers stay packed whatever this says)",
    "moe_backend": "where routed experts run: auto (default: CUDA resident if it fits else hybrid; no "
                   "CUDA: cpu), resident, offload, hybrid, cpu; ignored by a dense model",
    "expert_cache_gib": "GPU expert cache size in GiB (default: free VRAM after the other weights and "
                        "a KV reserve); ignored without experts or CUDA",
}


def _engine_args(p, help_for: dict[str, str] | None = None) -> None:
    add_engine_args(p, help_for=help_for)
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other engine option (see freetoken/config.py), e.g. kv_cache_gib=2")


def register(subparsers) -> None:
    s = subparsers.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server",
                              description="Serve a model over OpenAI (/v1/chat/completions, "
                              "/v1/completions, /v1/responses, /v1/models) and Anthropic "
                              "(/v1/messages) APIs. Without --model: SmolLM2-135M-Instruct when installed "
                              "(./ft installs it), else a random-weight demo model.")
    main = s.add_argument_group("main options")
    main.add_argument("--model", default=None, help="checkpoint directory, GGUF/FTW file, Ollama name or HF repo id "
                      "(default: SmolLM2-135M-Instruct if installed, else the random-weight demo; "
                      "`freetoken-demo`: the demo)")
    main.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    main.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free one)")
    main.add_argument("--served-model-name", default=None,
                      help="model id(s) clients use, comma-separated; the first is the main one")
    _request_args(s.add_argument_group("requests, limits and security"))
    _replica_args(s)
    # the engine flags a first run reaches for are explained here in their own words
    _engine_args(s.add_argument_group("engine options (also: freetoken generate, plan, perplexity)"), MAIN_ENGINE_HELP)
    s.set_defaults(func=cmd_serve)

    # one parser, launch_parser(), reads every option and prints the help (`freetoken launch
    # --help` shows one options section); this entry only hands it the rest of the line
    la = subparsers.add_parser("launch", add_help=False, prefix_chars="\0",
                               help="configure and start an agent CLI against a running server")
    la.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    la.set_defaults(func=cmd_launch)


def _request_args(srv) -> None:
    """Keys, queue limits, timeouts, allowed hosts and origins, admin, the memory watcher."""
    srv.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer or x-api-key) on every route but "
                   "/health; visible in ps: prefer --api-key-file or $FREETOKEN_API_KEY")
    srv.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="read the API key from this file (one line) instead (default: "
                   "$FREETOKEN_API_KEY, else no key)")
    srv.add_argument("--max-running-requests", type=int, default=16,
                   help="requests decoded together by the engine")
    srv.add_argument("--max-waiting-requests", type=int, default=256,
                   help="queued requests beyond that get 429 with Retry-After")
    srv.add_argument("--model-match", default="auto", choices=["auto", "strict", "any"],
                   help="unknown model ids: auto = 404 on OpenAI routes, mapped to the served "
                   "model on Anthropic routes (claude-*); strict = 404 everywhere; any = map all")
    srv.add_argument("--max-tokens-cap", type=int, default=None,
                   help="upper bound on any request's output tokens")
    srv.add_argument("--strict-max-tokens", action="store_true",
                   help="reject max_tokens above the room left in the context window (default: "
                   "lower it to fit, as agents send 32k-128k)")
    srv.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, let running requests finish for this many seconds; "
                   "the rest end with a 503 error event (default 30)")
    srv.add_argument("--stall-timeout", type=float, default=30.0,
                   help="abort a request whose client has read none of its output for this many "
                   "seconds (default 30)")
    srv.add_argument("--allowed-hosts", default="",
                   help="comma-separated Host names to answer besides loopback names and IP "
                   "addresses ('*' = any); other Host headers get 403 (DNS rebinding)")
    srv.add_argument("--cors-origins", default="",
                   help="comma-separated web origins (https://app.example) allowed to call the "
                   "server from a browser; default none: CORS off, requests with another "
                   "Origin get 403")
    srv.add_argument("--header-timeout-s", type=float, default=10.0,
                   help="close a connection whose request line and headers are not complete this "
                   "many seconds after its first byte (408; slowloris) (default 10)")
    srv.add_argument("--body-timeout-s", type=float, default=60.0,
                   help="close a connection whose request body is not complete this many seconds "
                   "after its headers (default 60)")
    srv.add_argument("--idle-timeout-s", type=float, default=5.0,
                   help="close a connection that sends nothing for this many seconds, after "
                   "connecting or between two requests (keep-alive) (default 5)")
    srv.add_argument("--max-body-mb", type=float, default=32,
                   help="largest request body accepted; bigger ones get 413 (default 32)")
    srv.add_argument("--admin-token", default=None,
                   help="enable GET/POST /admin/memory (runtime resizing) for requests carrying this "
                   "token as 'x-admin-token' or 'Authorization: Bearer' (default: off; "
                   "$FREETOKEN_ADMIN_TOKEN); visible in ps: prefer --admin-token-file")
    srv.add_argument("--admin-token-file", default=None, metavar="PATH",
                   help="read the admin token from this file (one line) instead")
    srv.add_argument("--memory-floor-gib", type=float, default=None,
                   help="watch free memory (host MemAvailable/cgroup, CUDA free): below this many GiB "
                   "give memory back (expert cache, then checkpoints, then unused KV blocks); "
                   "default: no watcher")
    srv.add_argument("--memory-ceiling-gib", type=float, default=None,
                   help="grow back toward the start-up plan only while more than this is free "
                   "(default: 1.5 x floor + 0.25)")
    srv.add_argument("--memory-watch-interval", type=float, default=5.0,
                   help="seconds between two watcher resizes at least (default 5)")
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


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


def cmd_serve(args) -> int:
    from ..server.build import DEMO_ARCH, build, conn_timeouts
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("freetoken").setLevel(args.log_level.upper())
    from ..server.guards.keys import resolve_keys
    resolve_keys(args)
    from ..server.operations.shutdown import bind_listener
    sock = bind_listener(args.host, args.port)      # before the model loads: a busy port fails now
    if getattr(args, "replicas", None) is not None:
        sock.close()                                # the replicas' front end binds its own
        from ..server.replicas.app import cmd_serve_replicas
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
        log.warning("serving a RANDOM-WEIGHT DEMO model (%s, built in %s): its output is gibberish. "
                    "Pass --model to serve a real checkpoint.", DEMO_ARCH, model)

    from ..server.operations.shutdown import GracefulServer, uvicorn_config

    class Server(GracefulServer):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.should_exit:
                return
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else args.port
            url = f"http://{args.host}:{port}"
            log.warning("FreeToken ready on %s  model=%s%s  (open %s/ in a browser; OpenAI base URL %s/v1, "
                        "Anthropic base URL %s)", url, svc.model_name,
                        " [RANDOM weights: a demo of the machinery, its answers are gibberish]" if demo else "",
                        url, url, url)
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
