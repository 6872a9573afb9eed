"""`freetoken launch claude|opencode|openclaw`: write the agent's provider configuration
for a running FreeToken server and start the agent. Every endpoint in it is the local
server; if that server does not answer, nothing is started (never a cloud fallback).

Each agent is told the server's real limits (from /v1/models) in its own configuration,
so that it compacts its history before the window overflows and never asks for more
output than the server gives."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from . import agent_window as aw
from ..server.guards.private_file import write_private

QUIET = {"claude": {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                    "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1"},
         "opencode": {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
                      "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1"},
         "openclaw": {"DO_NOT_TRACK": "1", "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_OFFLINE": "1",
                      "OPENCLAW_DISABLE_BONJOUR": "1"}}
# Variables that could send an agent to a cloud endpoint instead of ours.
CLOUD_VARS = ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY",
              "OPENAI_BASE_URL", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"]
NPM_PACKAGE = {"claude": "@anthropic-ai/claude-code", "opencode": "opencode-ai",
               "openclaw": "openclaw"}
ASSUMED_CONTEXT = 32768     # --dry-run without a server only
MAX_AGENT_OUTPUT = 8192     # a reply budget that leaves most of the window to the history
COMPACT_RESERVE_MAX = 20_000  # OpenCode's default reserve is min(20000, reply budget)
CLAUDE_MIN_COMPACT_WINDOW = 100_000
# A compaction request may prefill a whole window cold (a new system prompt: nothing cached);
# OpenClaw aborts each one after agents.defaults.compaction.timeoutSeconds (default 180 s).
# Budget for a slow CPU: 50 prompt tokens/s (the tiny model managed 418/s on a loaded 2-core box).
SLOW_PREFILL_TOKENS_PER_S = 50
OPENCLAW_COMPACTION_TIMEOUT_S = 180   # Claude Code raises a smaller auto-compact window to this


class LaunchError(Exception):
    """A one-line reason why the agent was not started."""


@dataclass
class Limits:
    model: str
    context: int             # the context window (prompt + reply)
    output: int              # what the agent is told it may ask for per reply
    cap: int | None = None   # the server's own output cap (max_output_tokens), if any


def agent_output(context: int, server_max_output: int | None) -> int:
    """A quarter of the window (at most 8192), never above the server's own cap."""
    out = max(1, min(MAX_AGENT_OUTPUT, context // 4))
    return min(out, server_max_output) if server_max_output else out


def compact_headroom(context: int, output: int) -> int:
    """Room an agent keeps free below the window when it decides to compact: the reply plus
    the next user message and tool results. A quarter of the window, at most 20000 (OpenCode's
    own ceiling on its reserve), never less than the reply budget: a small server output cap
    must not shrink it (OpenCode would compact only after the next message had overflowed)."""
    return min(context, max(output, min(COMPACT_RESERVE_MAX, context // 4)))


def compaction_timeout(context: int) -> int:
    """Seconds an agent should wait for one compaction request: a cold whole-window prefill
    at a slow CPU's speed, never below OpenClaw's own default."""
    return max(OPENCLAW_COMPACTION_TIMEOUT_S, -(-context // SLOW_PREFILL_TOKENS_PER_S))


def server_limits(server: str, api_key: str | None, model: str | None) -> Limits:
    url = server.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url, headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise LaunchError(f"no FreeToken server answers at {server} ({type(e).__name__}: {e}); "
                          f"start it with `freetoken serve` first") from None
    if r.status_code in (401, 403):
        raise LaunchError(
            f"the server at {server} requires an API key and " +
            ("rejected the one given" if api_key else "none was given") +
            ": pass --api-key KEY or set FREETOKEN_API_KEY to the key of `freetoken serve --api-key`")
    if r.status_code != 200:
        raise LaunchError(f"GET {url} answered {r.status_code}: {r.text[:200]}")
    try:
        rows = r.json()["data"]
        row = next((m for m in rows if m["id"] == model), rows[0]) if model else rows[0]
        context = int(row.get("max_model_len") or ASSUMED_CONTEXT)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise LaunchError(f"GET {url} did not list a model ({type(e).__name__}: {e}); is this a "
                          f"FreeToken (OpenAI-compatible) server?") from None
    cap = row.get("max_output_tokens")
    return Limits(model or row["id"], context, agent_output(context, cap), cap)


def user_claude_settings(home: Path) -> dict:
    """The user's own Claude Code settings (read, never written), less what could send it to
    a cloud endpoint or another model: their permissions, hooks, MCP servers still apply."""
    src = Path(os.environ.get("CLAUDE_CONFIG_DIR") or home / ".claude") / "settings.json"
    try:
        settings = json.loads(src.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(settings, dict):
        return {}
    for k in ("model", "apiKeyHelper", "awsAuthRefresh", "awsCredentialExport"):
        settings.pop(k, None)
    if isinstance(settings.get("env"), dict):
        settings["env"] = {k: v for k, v in settings["env"].items()
                           if k not in CLOUD_VARS and not k.startswith("ANTHROPIC_")}
    return settings


def plan(agent: str, server: str, limits: Limits, key: str, cfg_dir: Path,
         agent_args: list[str], home: Path | None = None
         ) -> tuple[dict[str, str], dict[Path, str], list[str]]:
    """(environment, files to write, command) for one agent. Nothing of the user's (under
    `home`, default ~) is written: Claude Code gets a profile of its own (CLAUDE_CONFIG_DIR),
    OpenCode and OpenClaw a config file named by a variable."""
    server = server.rstrip("/")
    model, context, output = limits.model, limits.context, limits.output
    env = dict(QUIET[agent])
    files: dict[Path, str] = {}
    if agent == "claude":
        settings = cfg_dir / "claude-settings.json"
        env.update(ANTHROPIC_BASE_URL=server, ANTHROPIC_AUTH_TOKEN=key, ANTHROPIC_MODEL=model,
                   ANTHROPIC_DEFAULT_OPUS_MODEL=model, ANTHROPIC_DEFAULT_SONNET_MODEL=model,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=model, ANTHROPIC_SMALL_FAST_MODEL=model,
                   # the window of a model id Claude Code does not know (else it assumes 1M
                   # and never compacts) and its reply budget
                   CLAUDE_CODE_MAX_CONTEXT_TOKENS=str(context),
                   CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(output))
        if context >= CLAUDE_MIN_COMPACT_WINDOW:    # below, Claude Code ignores it with a warning
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(context)
        files[settings] = json.dumps({"env": env, "model": model}, indent=2) + "\n"
        # Its own profile: Claude Code rewrites the settings.json of the profile it runs in
        # (2.1.x turns "model": "opus" into "opus[1m]" when ANTHROPIC_DEFAULT_OPUS_MODEL is set)
        # and keeps its state (.claude.json, projects/, sessions/) there; the user's settings
        # are layered in as a copy, refreshed at every launch.
        profile = cfg_dir / "claude"
        env["CLAUDE_CONFIG_DIR"] = str(profile)
        files[profile / "settings.json"] = json.dumps(
            user_claude_settings(home or Path.home()), indent=2) + "\n"
        cmd = ["claude", "--settings", str(settings), *agent_args]
    elif agent == "opencode":
        path = cfg_dir / "opencode.json"
        files[path] = json.dumps({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"freetoken": {
                "npm": "@ai-sdk/openai-compatible", "name": "FreeToken (local)",
                "options": {"baseURL": server + "/v1", "apiKey": key},
                # OpenCode 1.18 compacts once the last request's tokens reach limit.input -
                # compaction.reserved; without limit.input it is context - limit.output, no room
                # for the next message when the output cap is small. Our server takes a prompt
                # of up to the whole window (the reply is clipped to what is left).
                "models": {model: {"name": model, "limit": {
                    "context": context, "input": context, "output": output}}}}},
            "compaction": {"reserved": compact_headroom(context, output)},
            "model": f"freetoken/{model}", "small_model": f"freetoken/{model}",
            "autoupdate": False, "share": "disabled"}, indent=2) + "\n"
        env["OPENCODE_CONFIG"] = str(path)
        cmd = ["opencode", *agent_args]
    else:
        path = cfg_dir / "openclaw.json5"
        files[path] = json.dumps({
            "telemetry": {"enabled": False}, "update": {"checkOnStart": False},
            "agents": {"defaults": {"model": {"primary": f"freetoken/{model}"},
                                    "compaction": {"timeoutSeconds": compaction_timeout(context)}}},
            "models": {"mode": "merge", "providers": {"freetoken": {
                "baseUrl": server + "/v1", "apiKey": key, "api": "openai-completions",
                "models": [{"id": model, "name": f"{model} (FreeToken)", "contextWindow": context,
                            "maxTokens": output}]}}}}, indent=2) + "\n"
        # every subcommand reads the variable; only some accept --config
        env["OPENCLAW_CONFIG_PATH"] = str(path)
        cmd = ["openclaw", *agent_args]
    return env, files, cmd


def dry_run(env: dict[str, str], files: dict[Path, str], cmd: list[str]) -> None:
    for path, text in files.items():
        print(f"# would write {path} (mode 0600):\n{text}")
    print("# environment (cloud variables first unset, then ours):")
    print("unset " + " ".join(CLOUD_VARS))
    for k, v in env.items():
        print(f"export {k}={shlex.quote(v)}")
    print("# command:\n" + shlex.join(cmd))


def window_check(args, limits: Limits, key: str, exe: str) -> str | None:
    """None when the server's window holds the agent's first request (measured: one probe run
    of the agent, counted by the server) plus a reply and the compaction headroom; else why not
    and the window it needs. A probe that sees no request only warns."""
    def make_plan(url: str, cfg: Path, home: Path):
        return plan(args.agent, url, limits, key, cfg, aw.PROBE_ARGS[args.agent], home=home)

    print(f"freetoken launch: measuring {args.agent}'s first request (one run in a scratch "
          f"HOME; --skip-window-check skips it)", file=sys.stderr)
    captured = aw.capture_first_request(make_plan, exe)
    if captured is None:
        print(f"freetoken launch: warning: {args.agent} sent no request within "
              f"{aw.PROBE_TIMEOUT_S} s; the window was not checked", file=sys.stderr)
        return None
    try:
        first = aw.count_tokens(args.server, args.api_key, aw.as_messages_request(captured, limits.model))
    except (httpx.HTTPError, ValueError, KeyError) as e:
        print(f"freetoken launch: warning: the server did not count the agent's first request "
              f"({type(e).__name__}: {e}); the window was not checked", file=sys.stderr)
        return None
    room = compact_headroom(limits.context, limits.output)
    print(f"freetoken launch: {args.agent}'s first request is {first} tokens; the window is "
          f"{limits.context} (reply {limits.output}, compaction headroom {room})", file=sys.stderr)
    if limits.context - first >= room:
        return None
    need = aw.window_needed(first, lambda w: compact_headroom(w, agent_output(w, limits.cap)))
    return (f"the server's window ({limits.context} tokens) cannot hold {args.agent}'s first "
            f"request ({first} tokens: its system prompt and tools) plus a reply and room to "
            f"compact ({room}); it needs a window of at least {need}: restart the server with "
            f"`freetoken serve --max-model-len {need}` (or pass --skip-window-check).")


def launch(args) -> int:
    key = args.api_key or "freetoken"
    try:
        limits = server_limits(args.server, args.api_key, args.model)
    except LaunchError as e:
        if not args.dry_run:
            print(f"freetoken launch: {e}. Nothing was started.", file=sys.stderr)
            return 1
        limits = Limits(args.model or "freetoken-demo", ASSUMED_CONTEXT,
                        agent_output(ASSUMED_CONTEXT, None))
        print(f"freetoken launch: {e}.\nfreetoken launch: --dry-run goes on with ASSUMED limits "
              f"(model {limits.model}, context {limits.context}, output {limits.output}), not the "
              f"server's.", file=sys.stderr)
        print("# WARNING: no server answered; model, context and output below are assumptions")
    if args.agent == "claude" and limits.context < CLAUDE_MIN_COMPACT_WINDOW:
        print(f"freetoken launch: note: Claude Code compacts its history on its own only in a "
              f"window of {CLAUDE_MIN_COMPACT_WINDOW} tokens or more; this server's is "
              f"{limits.context}. For long sessions serve with --max-model-len "
              f"{CLAUDE_MIN_COMPACT_WINDOW} or more.", file=sys.stderr)
    cfg_dir = Path(args.config_dir or Path.home() / ".config" / "freetoken" / "agents")
    agent_args = [a for a in args.agent_args if a != "--"]
    env, files, cmd = plan(args.agent, args.server, limits, key, cfg_dir, agent_args)
    if args.dry_run:
        dry_run(env, files, cmd)
        return 0
    exe = shutil.which(cmd[0])
    if exe is None:
        print(f"freetoken launch: `{cmd[0]}` is not on PATH; install it (npm i -g "
              f"{NPM_PACKAGE[args.agent]}). Nothing was started.", file=sys.stderr)
        return 127
    if not args.skip_window_check:
        problem = window_check(args, limits, key, exe)
        if problem:
            print(f"freetoken launch: {problem} Nothing was started.", file=sys.stderr)
            return 1
    for path, text in files.items():
        write_private(path, text)
        print(f"wrote {path}", file=sys.stderr)
    print(f"freetoken launch: {shlex.join(cmd)}  (model {limits.model}, context {limits.context}, "
          f"output {limits.output})", file=sys.stderr)
    full_env = {k: v for k, v in os.environ.items() if k not in CLOUD_VARS}
    full_env.update(env)
    os.execvpe(exe, cmd, full_env)
    return 0  # not reached
