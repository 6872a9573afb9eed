"""What memory the machine has free, read once: host MemAvailable and the cgroup limit,
CUDA mem_get_info. Tests pass a MachineMemory of their own instead."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30


@dataclass(frozen=True)
class MachineMemory:
    host_total: int
    host_available: int           # min(MemAvailable, cgroup limit - cgroup usage)
    host_source: str              # where host_available came from
    device_free: int | None = None        # CUDA free bytes (None: no accelerator in use)
    device_total: int | None = None


def _meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except (OSError, ValueError):
        pass
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None      # "max" (no limit) -> None


def cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int] | None:
    """(limit, usage) of this process's memory cgroup, v2 or v1; None when unlimited."""
    for limit_f, usage_f in (("memory.max", "memory.current"),
                             ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit, usage = _read_int(root / limit_f), _read_int(root / usage_f)
        if limit is not None and usage is not None and limit < (1 << 60):
            return limit, usage
    return None


def probe(device_type: str = "cpu", device_index: int | None = None, meminfo: Path = Path("/proc/meminfo"),
          cgroup: Path = Path("/sys/fs/cgroup")) -> MachineMemory:
    """meminfo/cgroup: where to read them (the memory watcher's tests give files of their own)."""
    info = _meminfo(meminfo)
    total = info.get("MemTotal", 0)
    avail, source = info.get("MemAvailable", info.get("MemFree", 0)), "MemAvailable"
    cg = cgroup_room(cgroup)
    if cg is not None:
        limit, usage = cg
        total = min(total, limit) if total else limit
        if limit - usage < avail:
            avail, source = max(0, limit - usage), "cgroup limit"
    free = dtotal = None
    if device_type == "cuda":
        import torch
        free, dtotal = torch.cuda.mem_get_info(device_index if device_index is not None else torch.cuda.current_device())
    return MachineMemory(total, avail, source, free, dtotal)
