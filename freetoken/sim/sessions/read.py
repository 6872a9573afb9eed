"""Session files and folders in, `Session`s out: which reader a file needs (by suffix, then by
its JSON shape) and the walk over folders."""
from __future__ import annotations

import json
from pathlib import Path

from .formats import Session, SessionError, _append_only, _mini_swe_agent, _swe_agent, _tau_bench
from .mitm import read_mitm
from .openhands import read_openhands


def _read_file(path: Path) -> list[Session]:
    if path.suffix == ".mitm":
        return read_mitm(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SessionError(f"{path}: cannot read ({e})") from None
    if path.suffix == ".jsonl":
        return read_openhands(path, text)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SessionError(f"{path}: not JSON ({e})") from None
    if isinstance(data, dict) and "trajectory" in data:
        return _swe_agent(path, data)
    if isinstance(data, dict) and "messages" in data and (data.get("trajectory_format") or "info" in data):
        return _mini_swe_agent(path, data)
    if isinstance(data, list) and data and isinstance(data[0], dict) and "traj" in data[0]:
        return _tau_bench(path, data)
    if isinstance(data, dict) and isinstance(data.get("messages"), list):   # one chat request body
        return [Session(path.stem, "chat", _append_only(f"{path}: messages", data["messages"], data.get("tools")))]
    raise SessionError(f"{path}: unknown session format (expected a SWE-agent .traj, mini-swe-agent "
                       ".traj.json, tau-bench list of {{traj}}, OpenHands .jsonl or mitmproxy .mitm)")


SUFFIXES = (".traj", ".traj.json", ".json", ".jsonl", ".mitm")


def read_sessions(paths) -> list[Session]:
    """Sessions from files or folders (folders: every session file under them, sorted)."""
    sessions = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES))
            if not files:
                raise SessionError(f"{p}: no session files ({', '.join(SUFFIXES)}) in this folder")
        elif p.is_file():
            files = [p]
        else:
            raise SessionError(f"{p}: no such file or folder")
        for f in files:
            sessions += [s for s in _read_file(f) if s.requests]
    return sessions
