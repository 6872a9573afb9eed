"""`freetoken launch claude|opencode|openclaw`: write the agent's provider configuration
for a running FreeToken server and start the agent. Every endpoint in it is the local
server; if that server does not answer, nothing is started (never a cloud fallback)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import httpx

QUIET = {"claude": {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                    "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1"},
         "opencode": {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
                      "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1"},
         "openclaw": {"DO_NOT_TRACK": "1", "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_OFFLINE": "1",
                      "OPENCLAW_DISABLE_BONJOUR": "1"}}
# Variables that could send an agent to a cloud endpoint instead of ours.
CLOUD_VARS = ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY",
              "OPENAI_BASE_URL", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"]


def server_model(server: str, api_key: str | None) -> tuple[str, int | None]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(server.rstrip("/") + "/v1/models", headers=headers, timeout=10)
    r.raise_for_status()
    m = r.json()["data"][0]
    return m["id"], m.get("max_model_len")


def plan(agent: str, server: str, model: str, context: int | None, key: str, cfg_dir: Path,
         agent_args: list[str]) -> tuple[dict[str, str], dict[Path, str], list[str]]:
    """(environment, files to write, command) for one agent."""
    server = server.rstrip("/")
    context = context or 32768
    output = max(1, min(8192, context // 4))
    env = dict(QUIET[agent])
    files: dict[Path, str] = {}
    if agent == "claude":
        settings = cfg_dir / "claude-settings.json"
        env.update(ANTHROPIC_BASE_URL=server, ANTHROPIC_AUTH_TOKEN=key, ANTHROPIC_MODEL=model,
                   ANTHROPIC_DEFAULT_OPUS_MODEL=model, ANTHROPIC_DEFAULT_SONNET_MODEL=model,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=model, ANTHROPIC_SMALL_FAST_MODEL=model,
                   CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(output))
        files[settings] = json.dumps({"env": env, "model": model}, indent=2) + "\n"
        cmd = ["claude", "--settings", str(settings), *agent_args]
    elif agent == "opencode":
        path = cfg_dir / "opencode.json"
        files[path] = json.dumps({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"freetoken": {
                "npm": "@ai-sdk/openai-compatible", "name": "FreeToken (local)",
                "options": {"baseURL": server + "/v1", "apiKey": key},
                "models": {model: {"name": model, "limit": {"context": context, "output": output}}}}},
            "model": f"freetoken/{model}", "small_model": f"freetoken/{model}",
            "autoupdate": False, "share": "disabled"}, indent=2) + "\n"
        env["OPENCODE_CONFIG"] = str(path)
        cmd = ["opencode", *agent_args]
    else:
        path = cfg_dir / "openclaw.json5"
        files[path] = json.dumps({
            "telemetry": {"enabled": False}, "update": {"checkOnStart": False},
            "agents": {"defaults": {"model": {"primary": f"freetoken/{model}"}}},
            "models": {"mode": "merge", "providers": {"freetoken": {
                "baseUrl": server + "/v1", "apiKey": key, "api": "openai-completions",
                "models": [{"id": model, "name": f"{model} (FreeToken)", "contextWindow": context,
                            "maxTokens": output}]}}}}, indent=2) + "\n"
        cmd = ["openclaw", *agent_args, "--config", str(path)]
    return env, files, cmd


def launch(args) -> int:
    key = args.api_key or "freetoken"
    model, context = args.model, None
    try:
        served, context = server_model(args.server, args.api_key)
        model = model or served
    except Exception as e:  # noqa: BLE001
        if not args.dry_run:
            print(f"freetoken launch: the server at {args.server} does not answer ({e}); start it "
                  f"with `freetoken serve` first. Nothing was started.", file=sys.stderr)
            return 1
        model = model or "freetoken-demo"
    cfg_dir = Path(args.config_dir or Path.home() / ".config" / "freetoken" / "agents")
    agent_args = [a for a in args.agent_args if a != "--"]
    env, files, cmd = plan(args.agent, args.server, model, context, key, cfg_dir, agent_args)
    if args.dry_run:
        for path, text in files.items():
            print(f"# would write {path}:\n{text}")
        print("# environment:")
        for k, v in env.items():
            print(f"export {k}={v}")
        print("# unset " + " ".join(CLOUD_VARS))
        print("# command:\n" + " ".join(cmd))
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    exe = shutil.which(cmd[0])
    if exe is None:
        print(f"freetoken launch: `{cmd[0]}` is not on PATH; install it (npm i -g "
              f"{ {'claude': '@anthropic-ai/claude-code', 'opencode': 'opencode-ai', 'openclaw': 'openclaw'}[args.agent]})",
              file=sys.stderr)
        return 127
    full_env = {k: v for k, v in os.environ.items() if k not in CLOUD_VARS}
    full_env.update(env)
    os.execvpe(exe, cmd, full_env)
    return 0  # not reached
