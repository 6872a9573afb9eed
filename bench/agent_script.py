"""What the scripted "model" of bench/scripted_server.py says, read off the prompt alone (so
it survives compaction, retries and sub-agents): the decisions of a long agent session.

A long session reads round-01.txt .. round-NN.txt, one tool call per round (each file adds
FILE_BYTES of history, so the session crosses the context window and the agent must
compact); after round SUB_AT, Claude Code starts two sub-agents at once (two Agent tool
calls in one reply), each reading its own file. Compaction requests are answered with a
summary that carries the progress ("ROUNDS-DONE: k"), so the session continues after it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

MARK = re.compile(r"ROUND (\d+) MARKER")
DONE_MARK = re.compile(r"ROUNDS-DONE: (\d+)")
# The instructions each agent sends when it compacts its history.
COMPACTION_PHRASES = (
    "create a detailed summary of the conversation so far",        # Claude Code
    "anchored summary from the conversation history",               # OpenCode
    "conversation to summarize. Create a structured context checkpoint",  # OpenClaw
    "incorporate into the existing summary",                         # OpenClaw, again
)
TASK = ("Follow the instructions the assistant gives itself; read each file it asks for and "
        "stop when it says it is done.")


@dataclass
class Decision:
    kind: str          # "round" | "done" | "compaction" | "subagents" | "subagent" | "chat"
    text: str
    round: int = 0


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def read_call(prompt: str, path: Path) -> str:
    if '"name": "Read"' in prompt:                                   # Claude Code
        return call("Read", {"file_path": str(path)})
    if re.search(r'"name": "read".*"filePath"', prompt, re.S):       # OpenCode
        return call("read", {"filePath": str(path)})
    return call("read", {"path": path.name})                         # OpenClaw (cwd = workspace)


def messages(prompt: str) -> list[tuple[str, str]]:
    return re.findall(r"<\|im_start\|>(\w+)\n(.*?)(?=<\|im_end\|>|$)", prompt, re.S)


def write_workspace(ws: Path, rounds: int, file_bytes: int) -> None:
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "README.md").write_text("# scratch workspace for the scripted agent test\n")
    filler = "lorem ipsum dolor sit amet " * (file_bytes // 27 + 1)
    for k in range(1, rounds + 1):
        (ws / f"round-{k:02d}.txt").write_text(f"ROUND {k} MARKER\n{filler[:file_bytes]}\n")
    for s in "ab":
        (ws / f"sub-{s}.txt").write_text(f"SUBFILE {s} contents\n")


def decide(prompt: str, ws: Path, rounds: int, sub_at: int | None) -> Decision:
    msgs = messages(prompt)
    tail = msgs[-1][1] if msgs else prompt
    if msgs and msgs[-1][0] == "assistant":          # the generation prompt: look one further
        tail = msgs[-2][1] if len(msgs) > 1 else ""
    done_rounds = max([int(k) for k in MARK.findall(prompt)] +
                      [int(k) for k in DONE_MARK.findall(prompt)] + [0])
    subs_done = "SUBRESULT" in prompt or "SUBAGENTS-DONE: yes" in prompt
    tools = bool(re.search(r'"name": "read"', prompt, re.I))
    if any(p.lower() in tail.lower() for p in COMPACTION_PHRASES) or \
            (not tools and "summar" in tail.lower()):
        return Decision("compaction", f"Summary of the work so far. ROUNDS-DONE: {done_rounds}; "
                        f"SUBAGENTS-DONE: {'yes' if subs_done else 'no'}. The assistant reads "
                        f"round-NN.txt files one per turn and continues with the next one.",
                        done_rounds)
    users = [c for r, c in msgs if r == "user"]
    if users and "SUBTASK" in users[0]:              # inside a sub-agent's own conversation
        name = re.search(r"SUBTASK read (sub-\w\.txt)", users[0]).group(1)
        if "SUBFILE" in prompt:
            return Decision("subagent", f"SUBRESULT {name}: read it.")
        return Decision("subagent", read_call(prompt, ws / name))
    if not tools:
        return Decision("chat", "Reading files in rounds")          # titles and the like
    if sub_at is not None and done_rounds >= sub_at and not subs_done and '"name": "Agent"' in prompt:
        return Decision("subagents", "".join(
            call("Agent", {"description": f"read sub-{s}", "prompt": f"SUBTASK read sub-{s}.txt",
                           "subagent_type": "general-purpose", "run_in_background": False})
            for s in "ab"), done_rounds)
    if done_rounds >= rounds:
        return Decision("done", f"All done: {rounds} rounds read.", done_rounds)
    nxt = done_rounds + 1
    return Decision("round", read_call(prompt, ws / f"round-{nxt:02d}.txt"), nxt)
