"""The TCP sockets a process tree listens on, read from /proc (no tool needed): every
process whose parent chain reaches the root pid, or whose command line names a marker
(Ray's daemons are started detached from the driver: they name the session's temp dir),
and each LISTEN socket of /proc/<pid>/net/tcp{,6} whose inode one of their fds holds."""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def tree(root: int, markers: tuple[str, ...] = ()) -> set[int]:
    """root, its descendants, and every process whose command line holds a marker."""
    parents, cmd = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            pid = int(d.name)
            parents[pid] = _ppid(pid)
            try:
                cmd[pid] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd[pid] = ""
    out = {root} | {p for p, c in cmd.items() if any(m in c for m in markers)}
    grew = True
    while grew:
        new = {p for p, pp in parents.items() if pp in out and p not in out}
        out |= new
        grew = bool(new)
    return out


def _addr(hex_addr: str, v6: bool) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if v6:      # four little-endian 32-bit words
        raw = b"".join(struct.pack("<I", w) for w in struct.unpack(">4I", raw))
        host = str(ipaddress.IPv6Address(raw))
    else:
        host = socket.inet_ntoa(struct.pack("<I", int(ip, 16)))
    return f"{host}:{int(port, 16)}"


def listening(pids: set[int]) -> dict[str, list[int]]:
    """"host:port" -> the pids listening there (TCP, IPv4 and IPv6)."""
    inodes: dict[str, set[int]] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    t = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if t.startswith("socket:["):
                    inodes.setdefault(t[8:-1], set()).add(pid)
        except OSError:
            continue
    out: dict[str, list[int]] = {}
    seen_tables = set()
    for pid in pids:
        for name, v6 in (("tcp", False), ("tcp6", True)):
            path = f"/proc/{pid}/net/{name}"
            try:
                key = (os.stat(path).st_ino, name)
                lines = Path(path).read_text().splitlines()[1:]
            except OSError:
                continue
            if key in seen_tables:
                continue
            seen_tables.add(key)
            for ln in lines:
                f = ln.split()
                if f[3] == LISTEN and f[9] in inodes:
                    out.setdefault(_addr(f[1], v6), []).extend(sorted(inodes[f[9]]))
    return out


def is_loopback(hostport: str) -> bool:
    host = hostport.rsplit(":", 1)[0]
    ip = ipaddress.ip_address(host)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)
