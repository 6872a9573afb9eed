"""Replay a recorded agent session against a live `freetoken serve`, turn by turn, with the
whole history each time (as the agent sent it), once with the prefix cache on and once with
`--no-prefix-cache`; print per turn the prompt tokens, the cached tokens the server reports
(`usage.prompt_tokens_details.cached_tokens`) and the time to first token, side by side.
Then the headline case: a turn that appends ~200 tokens to an ~8k-token cached history,
TTFT warm vs cold (the issue's target: <= 0.1x).

TTFT is the latency of a max_tokens=1 request: admission + prefill + one sampled token.
The servers listen on 127.0.0.1 only.

    python bench/agent_turns.py                          # medium random Qwen3-MoE, one SWE-agent session
    python bench/agent_turns.py --model DIR --session FILE --turns 12 --history-tokens 8000
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from freetoken.sim.sessions import read_sessions  # noqa: E402

DEFAULT_SESSION = next((p / "shared/data/agent-sessions/swe-agent-1.0.1_selfhosted-lastn5/sympy__sympy-21612.traj"
                        for p in ROOT.parents if (p / "shared/data/agent-sessions").is_dir()), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`freetoken serve` in a subprocess on 127.0.0.1."""

    def __init__(self, model: str, cache: bool, max_model_len: int, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(self.port), "--served-model-name", "bench", "--max-model-len", str(max_model_len),
               "--log-level", "warning", *extra] + ([] if cache else ["--no-prefix-cache"])
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.proc.stderr.read().decode()[-2000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server did not start in 600 s")

    def chat(self, messages, tools=None) -> tuple[float, dict]:
        body = {"model": "bench", "messages": messages, "max_tokens": 1, "temperature": 0}
        if tools:
            body["tools"] = tools
        t = time.perf_counter()
        r = httpx.post(self.url + "/v1/chat/completions", json=body, timeout=3600)
        dt = time.perf_counter() - t
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        return dt, r.json()["usage"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wire(messages: list[dict]) -> list[dict]:
    """Neutral messages back to OpenAI wire form (tool-call arguments as JSON strings)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"])
                                                     if isinstance(c["function"]["arguments"], dict)
                                                     else c["function"]["arguments"]))
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def session_turns(server_on: Server, server_off: Server, session, turns: int, max_prompt: int):
    print(f"session {session.name} ({session.format}), first {turns} turns, whole history each turn")
    print(f"{'turn':>4} {'prompt':>7} | {'cache on: cached':>16} {'TTFT s':>7} | {'cache off: cached':>17} "
          f"{'TTFT s':>7} | {'on/off':>6}")
    tot_on = tot_off = 0.0
    for i, req in enumerate(session.requests[:turns]):
        msgs = wire(req.messages)
        t_on, u_on = server_on.chat(msgs, req.tools)
        if u_on["prompt_tokens"] > max_prompt:
            print(f"{i:>4} {u_on['prompt_tokens']:>7} | prompt longer than --max-prompt; stopping")
            break
        t_off, u_off = server_off.chat(msgs, req.tools)
        tot_on, tot_off = tot_on + t_on, tot_off + t_off
        print(f"{i:>4} {u_on['prompt_tokens']:>7} | {cached(u_on):>16} {t_on:>7.2f} | {cached(u_off):>17} "
              f"{t_off:>7.2f} | {t_on / t_off:>6.3f}")
    if tot_off:
        print(f"total TTFT: cache on {tot_on:.1f} s, cache off {tot_off:.1f} s, ratio {tot_on / tot_off:.3f}")


def filler(n_words: int, seed: int) -> str:
    words = ("the quick brown fox jumps over the lazy dog while a model routes every token to a few experts "
             "and the cache keeps the hot ones close def main return import json print value list").split()
    return " ".join(words[(i * 7 + seed) % len(words)] for i in range(n_words))


def append_case(server_on: Server, server_off: Server, history_tokens: int, append_tokens: int):
    """An agent history of ~history_tokens (system, user, tool outputs), then one more turn of
    ~append_tokens: warm (history cached) vs cold (cache off), same request."""
    probe = [{"role": "user", "content": filler(400, 0)}]
    per_word = server_off.chat(probe)[1]["prompt_tokens"] / 400
    hist = [{"role": "system", "content": "You are a coding agent. " + filler(int(300 / per_word), 1)}]
    for k in range(1, max(2, round((history_tokens - 300) / 1030)) + 1):    # ~1030 tokens per step
        hist += [{"role": "user", "content": f"step {k}: " + filler(int(900 / per_word), k)},
                 {"role": "assistant", "content": f"done {k}: " + filler(int(100 / per_word), k + 50)}]
    turn = hist + [{"role": "user", "content": "next"}]
    n = server_on.chat(turn)[1]["prompt_tokens"]            # the agent's previous turn: fills the cache
    nxt = turn + [{"role": "assistant", "content": "ok"},
                  {"role": "user", "content": filler(int(append_tokens / per_word), 99)}]
    t_warm, u_warm = server_on.chat(nxt)
    t_cold, u_cold = server_off.chat(nxt)
    print(f"\nappend case: history {n} tokens, new turn {u_warm['prompt_tokens']} tokens "
          f"(+{u_warm['prompt_tokens'] - n})")
    print(f"  cache on : cached {cached(u_warm):>6}, TTFT {t_warm:.3f} s")
    print(f"  cache off: cached {cached(u_cold):>6}, TTFT {t_cold:.3f} s")
    print(f"  TTFT warm/cold = {t_warm / t_cold:.3f} (target <= 0.1)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint folder (default: a cached medium random Qwen3-MoE, 2 layers, 16k context)")
    ap.add_argument("--session", default=str(DEFAULT_SESSION) if DEFAULT_SESSION else None,
                    help="a session file in an agent-sessions format")
    ap.add_argument("--turns", type=int, default=8, help="turns of the session to replay (default 8)")
    ap.add_argument("--history-tokens", type=int, default=8000, help="append case: history length (default 8000)")
    ap.add_argument("--append-tokens", type=int, default=200, help="append case: new turn length (default 200)")
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--max-prompt", type=int, default=12000, help="stop the session replay past this prompt length")
    ap.add_argument("--skip-session", action="store_true", help="only the append case")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `freetoken serve` argument (repeat)")
    args = ap.parse_args()
    model = args.model
    if model is None:
        from common import MEDIUM_QWEN3, medium_checkpoint
        # Qwen3-30B-A3B per-layer shapes, 2 layers (two servers share the machine), 16k context
        model = str(medium_checkpoint(name="qwen3-moe-medium-2l-16k",
                                      **dict(MEDIUM_QWEN3, layers=2, max_position_embeddings=16384)))
    on = Server(model, True, args.max_model_len, args.server_arg)
    off = Server(model, False, args.max_model_len, args.server_arg)
    try:
        if not args.skip_session and args.session:
            [session] = read_sessions([args.session])[:1]
            session_turns(on, off, session, args.turns, args.max_prompt)
        append_case(on, off, args.history_tokens, args.append_tokens)
    finally:
        on.stop()
        off.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
