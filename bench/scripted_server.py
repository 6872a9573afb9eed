"""A FreeToken server whose "model" is scripted, for bench/agents_e2e.sh --scripted: on a
fresh user turn it calls the agent's read tool on README.md, after the tool result it
answers "All done: <first line of the file>". It checks that real agents run our tool calls
and send the results back. With --rounds N it plays a long session instead (see
bench/agent_script.py): N tool-call rounds that outgrow --max-model-len, so the agent must
compact and go on. Only ever binds 127.0.0.1.

Usage: python bench/scripted_server.py --port 8765 --workspace DIR
       python bench/scripted_server.py --port 8765 --workspace DIR --rounds 13 \
           --file-bytes 6000 --max-model-len 100000 [--sub-at 3]
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

import torch
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_script import decide, write_workspace  # noqa: E402
from fake_engine import FakeEngine, FakeParams  # noqa: E402

from freetoken.engine.client import client_names  # noqa: E402
from freetoken.server.app import create_app  # noqa: E402
from freetoken.server.generation import GenerationService  # noqa: E402
from freetoken.server.server_state import ServerSettings  # noqa: E402


log = logging.getLogger("scripted")


class ScriptedAgentEngine(FakeEngine):
    def __init__(self, workspace: Path, rounds: int = 0, sub_at: int | None = None,
                 max_model_len: int = 1 << 20):
        super().__init__(chars_per_step=8, max_model_len=max_model_len)
        self.ws, self.rounds, self.sub_at = workspace, rounds, sub_at
        self.readme = workspace / "README.md"

    def add_request(self, request_id, prompt_token_ids, params):
        prompt = self.tokenizer.decode(prompt_token_ids)
        if self.rounds:
            d = decide(prompt, self.ws, self.rounds, self.sub_at)
            log.info("script req=%s kind=%s round=%d", request_id, d.kind, d.round)
            self.default = d.text
            return super().add_request(request_id, prompt_token_ids, params)
        last_tool = prompt.rfind("<|im_start|>tool")
        if last_tool >= 0:                        # (OpenClaw adds a user context message after it)
            result = prompt[last_tool:].split("\n", 1)[1]
            first = next((ln for ln in result.splitlines() if "scratch" in ln), result[:60])
            self.default = f"All done: {first.strip()}"
        elif '"name": "Read"' in prompt:          # Claude Code
            self.default = call("Read", {"file_path": str(self.readme)})
        elif re.search(r'"name": "read".*"filePath"', prompt, re.S):   # OpenCode
            self.default = call("read", {"filePath": str(self.readme)})
        elif '"name": "read"' in prompt:          # OpenClaw
            self.default = call("read", {"path": "README.md"})
        else:                                     # title requests and the like
            self.default = "Reading a README"
        super().add_request(request_id, prompt_token_ids, params)


class ForcedEngine:
    """A real engine (real prefill, decode, KV and prefix cache, real timings) whose output
    tokens are forced to the script's text, so a random-weight model can drive an agent."""

    def __init__(self, engine, workspace: Path, rounds: int, sub_at: int | None):
        self.engine, self.ws, self.rounds, self.sub_at = engine, workspace, rounds, sub_at
        self.eos = min(engine.tokenizer.eos_token_ids)

    def __getattr__(self, name):
        if name not in client_names():      # an engine client: the server gets nothing else
            raise AttributeError(f"ForcedEngine forwards EngineClient's names only, not {name!r}")
        return getattr(self.engine, name)

    def add_request(self, request_id, prompt_token_ids, params):
        prompt = self.engine.tokenizer.decode(prompt_token_ids)
        d = decide(prompt, self.ws, self.rounds, self.sub_at)
        log.info("script req=%s kind=%s round=%d", request_id, d.kind, d.round)
        target = self.engine.tokenizer.encode(d.text) + [self.eos]
        params.logits_processors = [*params.logits_processors, force(target)]
        return self.engine.add_request(request_id, prompt_token_ids, params)


def force(target: list[int]):
    def proc(out_ids, logits):
        t = target[min(len(out_ids), len(target) - 1)]
        forced = torch.full_like(logits, float("-inf"))
        forced[t] = 0.0
        return forced
    return proc


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--workspace", required=True)
    p.add_argument("--served-model-name", default="freetoken-demo")
    p.add_argument("--rounds", type=int, default=0, help="play a long session of N tool rounds")
    p.add_argument("--file-bytes", type=int, default=6000, help="history each round adds")
    p.add_argument("--sub-at", type=int, default=None,
                   help="after this round, start two sub-agents at once (Claude Code)")
    p.add_argument("--max-model-len", type=int, default=1 << 20)
    p.add_argument("--max-tokens-cap", type=int, default=None)
    p.add_argument("--model", default=None, help="a checkpoint whose real engine runs every "
                   "request, its output forced to the script (needs --rounds)")
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ws = Path(args.workspace)
    write_workspace(ws, args.rounds, args.file_bytes)
    if args.model:
        from freetoken import LLM
        opts = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.engine_option)}
        llm = LLM(args.model, dtype="float32", max_model_len=args.max_model_len, **opts)
        engine = ForcedEngine(llm.engine, ws, args.rounds, args.sub_at)
    else:
        engine = ScriptedAgentEngine(ws, args.rounds, args.sub_at, args.max_model_len)
    svc = GenerationService(engine, model_name=args.served_model_name,
                            architecture="Qwen3MoeForCausalLM", params_cls=FakeParams,
                            max_tokens_cap=args.max_tokens_cap)
    app = create_app(svc, ServerSettings(model_names=[args.served_model_name], model_match="any"))
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="info")
    server = uvicorn.Server(config)
    orig = server.startup

    async def startup(sockets=None):
        await orig(sockets)
        print(f"READY http://127.0.0.1:{args.port}", flush=True)
    server.startup = startup
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
