"""A FreeToken server whose "model" is scripted, for bench/agents_e2e.sh --scripted: on a
fresh user turn it calls the agent's read tool on README.md, after the tool result it
answers "All done: <first line of the file>". It checks that real agents run our tool calls
and send the results back. Only ever binds 127.0.0.1.

Usage: python bench/scripted_server.py --port 8765 --workspace DIR
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from fake_engine import FakeEngine, FakeParams  # noqa: E402

from freetoken.server.app import create_app  # noqa: E402
from freetoken.server.generation import GenerationService  # noqa: E402
from freetoken.server.server_state import Settings  # noqa: E402


class ScriptedAgentEngine(FakeEngine):
    def __init__(self, workspace: Path):
        super().__init__(chars_per_step=8)
        self.readme = workspace / "README.md"

    def add_request(self, request_id, prompt_token_ids, params):
        prompt = self.tokenizer.decode(prompt_token_ids)
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


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--workspace", required=True)
    p.add_argument("--served-model-name", default="freetoken-demo")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ws = Path(args.workspace)
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "README.md").write_text("# scratch workspace for the scripted agent test\n")
    svc = GenerationService(ScriptedAgentEngine(ws), model_name=args.served_model_name,
                            architecture="Qwen3MoeForCausalLM", params_cls=FakeParams)
    app = create_app(svc, Settings(model_names=[args.served_model_name], model_match="any"))
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
