"""Measured bandwidths: the profile written by `freetoken profile` and the online
estimates kept current while serving.

B_P: bytes/s of expert rows copied host -> cache (pinned, real rows, the model's format).
B_H: bytes/s of expert weights the host memory system delivers; the CPU branch gets
     B_H - B_P while the link is busy (they share it). q* = m * B_P / B_H.
B_D: bytes/s the disk delivers to the disk tier's expert reads (diskbw.py): the disk tier
     prefetches at most B_D * (time between two layer calls) / expert bytes predicted experts.

One meaning of B_H everywhere (`q_rates`: the engine's estimator, `freetoken sim project`
and the profile file's readers all call it): B_H = B_P' + C', with B_P' the link's rate while
the CPU branch runs and C' the CPU branch's rate while the link runs, measured (`b_p_shared`,
`b_h_shared`) or, without them, modelled as B_P and B_H_alone - B_P (at least 10% of
B_H_alone). With both branches busy the whole layer, q/B_P' = (m - q)/C' gives q* exactly.

A profile file holds one entry per (machine, device, expert format):
  {"version": 1, "profiles": {"<machine>|<device>|<format>": {"b_p": .., "b_h": .., ...}}}

Online: each fill job gives a B_P sample (bytes / link seconds), each CPU-branch run a
residual sample (bytes / CPU seconds, measured with the link busy or not). Both are
EWMAs over seconds-per-byte, so q* tracks other programs contending for memory or link.
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ...platform import cpu_model

DEFAULT_PROFILE = Path.home() / ".cache" / "freetoken" / "bandwidth.json"


@dataclass
class BandwidthProfile:
    b_p: float                       # link alone, bytes/s
    b_h: float                       # CPU expert execution alone, bytes/s of weights
    b_p_shared: float | None = None  # link while the CPU branch runs
    b_h_shared: float | None = None  # CPU branch while the link runs
    read_bw: float | None = None     # STREAM-like host read bandwidth (the roofline of b_h)
    b_d: float | None = None         # disk -> host cache, whole-expert reads, several in flight
    disk_queue_depth: int | None = None   # reads in flight at which b_d was best (diskbw.best_queue_depth)
    disk_direct: bool | None = None  # b_d measured with O_DIRECT reads (the filesystem allows them)
    machine: str = ""
    device: str = ""
    fmt: str = ""
    expert_nbytes: int = 0
    threads: int = 0
    measured_at: float = field(default_factory=time.time)

    @property
    def key(self) -> str:
        return profile_key(self.machine, self.device, self.fmt)


def profile_key(machine: str, device: str, fmt: str) -> str:
    return f"{machine}|{device}|{fmt}"


def machine_id() -> str:
    return f"{platform.node()}/{cpu_model()}/{os.cpu_count()}cpu"


def device_id(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def format_id(pool) -> str:
    """Expert format, storage dtype and shape: what the bandwidths depend on."""
    dtypes = sorted({str(b.dtype).replace("torch.", "") for g in getattr(pool, "groups", [pool])
                     for b in g.banks.values()})
    s = pool.spec
    return f"{s.fmt}:{'+'.join(dtypes)}:{s.hidden}x{s.intermediate}"


def load_profile(path: str | os.PathLike, machine: str, device: str, fmt: str) -> BandwidthProfile | None:
    """The entry for exactly this key, else the same machine+device with another format
    (bandwidths change little with the format), else None."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    entries = data.get("profiles", {})
    entry = entries.get(profile_key(machine, device, fmt))
    if entry is None:
        prefix = profile_key(machine, device, "")
        entry = next((v for k, v in entries.items() if k.startswith(prefix)), None)
    if entry is None:
        return None
    known = BandwidthProfile.__dataclass_fields__
    return BandwidthProfile(**{k: v for k, v in entry.items() if k in known})


def save_profile(path: str | os.PathLike, prof: BandwidthProfile) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data.setdefault("version", 1)
    data.setdefault("profiles", {})[prof.key] = asdict(prof)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bandwidth-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def concurrent_rates(b_p: float, b_h: float, b_p_shared: float | None = None,
                     b_h_shared: float | None = None) -> tuple[float, float]:
    """(link rate, CPU-branch rate) while both branches run, any unit: the measured shared
    rates when given, else the model's (the link unchanged, the CPU branch gets B_H - B_P)."""
    link = b_p_shared if b_p_shared else b_p
    cpu = b_h_shared if b_h_shared else max(b_h - b_p, 0.1 * b_h)
    return link, cpu


def q_rates(link: float, cpu: float) -> tuple[float, float]:
    """(B_P, B_H) for q* = m * B_P / B_H from the concurrent link and CPU-branch rates."""
    return link, link + cpu


def profile_q_rates(prof: BandwidthProfile) -> tuple[float, float]:
    """(B_P, B_H) of a `freetoken profile` entry, bytes/s: what the engine starts q* from."""
    return q_rates(*concurrent_rates(prof.b_p, prof.b_h, prof.b_p_shared, prof.b_h_shared))


class BandwidthEstimator:
    """EWMA estimates of the fill rate (B_P) and the CPU branch's rate (B_H - B_P)."""

    MIN_SAMPLE_S = 20e-6     # shorter branch timings are mostly timer noise

    def __init__(self, b_p: float, b_h: float, alpha: float = 0.2, online: bool = True):
        self.alpha, self.online = alpha, online
        self.fill_spb = 1.0 / b_p                       # seconds per byte
        self.cpu_spb = 1.0 / max(b_h - b_p, 0.1 * b_h)
        self.samples = {"fill": 0, "cpu": 0}

    @classmethod
    def from_profile(cls, prof: BandwidthProfile | None, device: torch.device, **kw) -> "BandwidthEstimator":
        if prof is None:                                # online estimates take over within a few steps
            b_p, b_h = (25e9, 50e9) if torch.device(device).type == "cuda" else (10e9, 20e9)
            return cls(b_p, b_h, **kw)
        est = cls(prof.b_p, prof.b_h, **kw)
        link, cpu = concurrent_rates(prof.b_p, prof.b_h, prof.b_p_shared, prof.b_h_shared)
        est.fill_spb, est.cpu_spb = 1.0 / link, 1.0 / cpu
        return est

    @property
    def b_p(self) -> float:
        return 1.0 / self.fill_spb

    @property
    def cpu_rate(self) -> float:
        return 1.0 / self.cpu_spb

    @property
    def b_h(self) -> float:
        return q_rates(self.b_p, self.cpu_rate)[1]

    def _ewma(self, old: float, n: int, nbytes: int, seconds: float) -> float:
        # A running mean for the first samples (a wrong starting profile is forgotten within a
        # few steps), then an EWMA that follows contention.
        a = max(self.alpha, 1.0 / (n + 2))
        return (1 - a) * old + a * (seconds / nbytes)

    def observe_fill(self, nbytes: int, seconds: float | None) -> None:
        if self.online and nbytes > 0 and seconds and seconds >= self.MIN_SAMPLE_S:
            self.fill_spb = self._ewma(self.fill_spb, self.samples["fill"], nbytes, seconds)
            self.samples["fill"] += 1

    def observe_cpu(self, nbytes: int, seconds: float | None) -> None:
        if self.online and nbytes > 0 and seconds and seconds >= self.MIN_SAMPLE_S:
            self.cpu_spb = self._ewma(self.cpu_spb, self.samples["cpu"], nbytes, seconds)
            self.samples["cpu"] += 1

    def snapshot(self) -> dict:
        return {"b_p_gbs": self.b_p / 1e9, "b_h_gbs": self.b_h / 1e9,
                "cpu_branch_gbs": self.cpu_rate / 1e9, "online": self.online,
                **{f"{k}_samples": v for k, v in self.samples.items()}}
