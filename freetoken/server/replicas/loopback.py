"""Keeping a local Ray instance on loopback when `serve --replicas` was asked for a loopback
`--host`. Ray 2.60's daemons bind their gRPC/HTTP ports on every interface with no option to
change it, so the CLI re-runs itself once with an LD_PRELOAD shim (c/loopback_bind.c, built
with the system C compiler and cached like the CPU kernels) that every process of the
instance inherits, with Ray's single-node switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: the
addresses its Python side derives are 127.0.0.1), and starts Ray with node IP 127.0.0.1. Without a C compiler it refuses to
start rather than expose an unauthenticated Ray (`--host 0.0.0.0` is the explicit choice)."""
from __future__ import annotations

import hashlib
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

from ...kernels import c_compiler, cache_dir, link_atomically

SOURCE = Path(__file__).with_name("c") / "loopback_bind.c"
MARK = "FREETOKEN_RAY_LOOPBACK"         # set in the re-run process (and inherited by Ray's)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def build_shim() -> Path:
    """The shared library, compiled once per source and compiler."""
    cc = c_compiler()
    if cc is None:
        raise SystemExit("freetoken serve --replicas --host 127.0.0.1 needs a C compiler (cc) to keep Ray's "
                         "ports on loopback; install one, or choose --host 0.0.0.0 to expose Ray on purpose")
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + ver.encode()).hexdigest()[:16]
    out = cache_dir() / f"loopback_bind-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        return link_atomically(out, lambda tmp: [cc, "-O2", "-shared", "-fPIC", str(SOURCE), "-o", tmp, "-ldl"])
    except RuntimeError as e:
        raise SystemExit(f"freetoken serve: building the loopback shim failed: {e}") from None


def rerun_on_loopback(argv: list[str]) -> None:
    """Re-run this CLI invocation (`freetoken ARGV`) with the shim preloaded (once: the mark
    stops a loop)."""
    if os.environ.get(MARK) == "1":
        return
    shim = build_shim()
    env = dict(os.environ)
    env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(shim), env.get("LD_PRELOAD")) if p)
    env[MARK] = "1"
    # Ray's own switch for a single-node instance on loopback (its default on macOS/Windows):
    # every address Ray's Python side derives for this node is then 127.0.0.1
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "freetoken.cli", *argv], env)
