"""What memory the machine has free, read once: host MemAvailable and the memory cgroup limit
of this process (v2 memory.max or v1 memory.limit_in_bytes, its own cgroup and every ancestor,
found through /proc/self/cgroup), CUDA mem_get_info. Tests pass a MachineMemory of their own
instead."""
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
    total_source: str = "MemTotal"    # "cgroup limit": host_total is a hard limit (past it: the OOM killer)


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


def own_cgroup_dirs(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> list[Path]:
    """The memory cgroup directories this process is in, innermost first, up to the mount root:
    cgroup v1 (the `memory` controller's line of /proc/self/cgroup, under root/memory) and v2
    (the `0::` line, under root or root/unified). A path that is not there (a cgroup namespace
    shows `/`, or the hierarchy is mounted elsewhere) falls back to the mount root."""
    dirs: list[Path] = []
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in ctrls.split(","):
            mounts = [root / "memory"]
        elif ctrls == "":
            mounts = [root, root / "unified"]
        else:
            continue
        for mount in mounts:
            here = mount / path.strip("/")
            if not here.is_dir():
                continue
            while True:                                   # the cgroup and every ancestor
                dirs.append(here)
                if here == mount:
                    break
                here = here.parent
    return dirs


def _limit_usage(d: Path) -> tuple[int, int] | None:
    for limit_f, usage_f in (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes")):
        limit, usage = _read_int(d / limit_f), _read_int(d / usage_f)
        if limit is not None and usage is not None and limit < (1 << 60):
            return limit, usage
    return None


def cgroup_room(root: Path | None = None, mount: Path = Path("/sys/fs/cgroup"),
                proc: Path = Path("/proc/self/cgroup")) -> tuple[int, int] | None:
    """(limit, usage) of the tightest memory cgroup limit over this process (its own cgroup or
    an ancestor's, v2 memory.max or v1 memory.limit_in_bytes); None when unlimited. `root`: a
    directory holding the limit files themselves (tests), or the cgroup mount root's legacy
    files (root/memory.max, root/memory/memory.limit_in_bytes) when /proc/self/cgroup names none."""
    if root is not None:
        dirs = [root, root / "memory"]
    else:
        dirs = own_cgroup_dirs(mount, proc) + [mount, mount / "memory"]
    found = [r for r in map(_limit_usage, dirs) if r is not None]
    return min(found, key=lambda lu: lu[0] - lu[1]) if found else None


def probe(device_type: str = "cpu", device_index: int | None = None, meminfo: Path = Path("/proc/meminfo"),
          cgroup: Path | None = None) -> MachineMemory:
    """meminfo/cgroup: where to read them (the memory watcher's tests give files of their own;
    default: this process's own cgroups). Under a cgroup limit, host_total is the limit: what
    this process may ever hold, whatever the machine has."""
    info = _meminfo(meminfo)
    total = info.get("MemTotal", 0)
    avail, source = info.get("MemAvailable", info.get("MemFree", 0)), "MemAvailable"
    tsource = "MemTotal"
    cg = cgroup_room(cgroup)
    if cg is not None:
        limit, usage = cg
        if not total or limit < total:
            total, tsource = limit, "cgroup limit"
        if limit - usage < avail:
            avail, source = max(0, limit - usage), "cgroup limit"
    free = dtotal = None
    if device_type == "cuda":
        import torch
        free, dtotal = torch.cuda.mem_get_info(device_index if device_index is not None else torch.cuda.current_device())
    return MachineMemory(total, avail, source, free, dtotal, tsource)
