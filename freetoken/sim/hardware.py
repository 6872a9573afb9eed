"""A machine as the projection sees it: a few bandwidths, in GB/s (1e9 bytes/s).

Fields: ``link_gbps`` B_P (host->device expert copies alone), ``cpu_gbps`` B_H (CPU
expert execution alone, bytes of expert weights consumed per second), the same two
while both branches run (``link_concurrent_gbps``, ``cpu_concurrent_gbps``), and
``device_gbps`` (device memory bandwidth: expert GEMVs and dense weights are read at
it). A preset may give ``host_peak_gbps`` instead of the concurrent pair: when
B_P + B_H exceeds it, both are scaled down in proportion while they overlap.
A ``freetoken profile`` file (``{"version": 1, "profiles": {"machine|device|format":
{"b_p", "b_h", "b_p_shared", "b_h_shared", ...}}}``, bytes/s) is read too: its CUDA entry
if it has one, else its first. It does not measure the device's memory bandwidth: that
comes from ``DEVICE_GBPS`` by GPU name, from B_H for a CPU cache tier, or from the caller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from freetoken.errors import FreeTokenError
from freetoken.experts.measure.bandwidth import concurrent_rates


class HardwareError(FreeTokenError, ValueError):
    """A hardware preset or profile is missing or lacks a field (message names file and field)."""


@dataclass(frozen=True)
class Hardware:
    name: str
    link_gbps: float
    cpu_gbps: float
    link_concurrent_gbps: float
    cpu_concurrent_gbps: float
    device_gbps: float
    description: str = ""


DEVICE_GBPS = {  # memory bandwidth by GPU name (vendor specifications)
    "RTX 5090": 1792, "RTX 4090": 1008, "RTX 3090": 936, "RTX 4060": 256, "RTX 4080": 717, "RTX 3080": 760,
    "A100": 1555, "H100": 3350, "H200": 4800, "L4": 300, "L40": 864,
}


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).joinpath("hardware").iterdir() if p.name.endswith(".json"))


def load_hardware(name_or_path: str, device_gbps: float | None = None) -> Hardware:
    if name_or_path in preset_names():
        source = resources.files(__package__).joinpath("hardware", name_or_path + ".json")
        data = json.loads(source.read_text())
        return parse_hardware({**data, **({"device_gbps": device_gbps} if device_gbps else {})}, f"preset {name_or_path}", name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise HardwareError(f"{name_or_path}: neither a preset ({', '.join(preset_names())}) nor a JSON file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise HardwareError(f"{path}: not valid JSON ({e.msg})") from None
    if isinstance(data, dict) and "profiles" in data:
        data = from_engine_profile(data, str(path))
    if device_gbps:
        data = {**data, "device_gbps": device_gbps}
    return parse_hardware(data, str(path), path.stem)


def from_engine_profile(data: dict, where: str) -> dict:
    """Map one entry of a ``freetoken profile`` file onto the hardware fields."""
    entries = data["profiles"]
    if not isinstance(entries, dict) or not entries:
        raise HardwareError(f"{where}: field 'profiles' holds no measurements")
    key = next((k for k in entries if "|cuda" in k), next(iter(entries)))
    entry = entries[key]
    out = {"name": key}
    rates = {}
    for src in ("b_p", "b_h", "b_p_shared", "b_h_shared"):
        value = entry.get(src)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            rates[src] = value / 1e9
        elif src in ("b_p", "b_h"):
            raise HardwareError(f"{where}: profile {key!r} has no positive field {src!r} (bytes/s)")
    out["link_gbps"], out["cpu_gbps"] = rates["b_p"], rates["b_h"]
    # the engine's reading of the same entry (one meaning of B_H: experts/measure/bandwidth.py)
    out["link_concurrent_gbps"], out["cpu_concurrent_gbps"] = concurrent_rates(
        rates["b_p"], rates["b_h"], rates.get("b_p_shared"), rates.get("b_h_shared"))
    device = str(entry.get("device", ""))
    if device == "cpu":
        out["device_gbps"] = out["cpu_gbps"]  # the cache tier is host memory
    else:
        out.update({"device_gbps": v for name, v in DEVICE_GBPS.items() if name in device})
    return out


def _positive(data: dict, field: str, where: str, required: bool = True) -> float | None:
    value = data.get(field)
    if value is None:
        if required:
            hint = "; pass --device-gbps" if field == "device_gbps" else ""
            raise HardwareError(f"{where}: missing field {field} (GB/s){hint}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise HardwareError(f"{where}: field {field} must be a positive number of GB/s, got {value!r}")
    return float(value)


def parse_hardware(data: dict, where: str, default_name: str) -> Hardware:
    if not isinstance(data, dict):
        raise HardwareError(f"{where}: expected a JSON object")
    link = _positive(data, "link_gbps", where)
    cpu = _positive(data, "cpu_gbps", where)
    device = _positive(data, "device_gbps", where)
    link_c = _positive(data, "link_concurrent_gbps", where, required=False)
    cpu_c = _positive(data, "cpu_concurrent_gbps", where, required=False)
    if (link_c is None) != (cpu_c is None):
        raise HardwareError(f"{where}: give both link_concurrent_gbps and cpu_concurrent_gbps, or neither")
    if link_c is None:
        peak = _positive(data, "host_peak_gbps", where, required=False)
        scale = min(1.0, peak / (link + cpu)) if peak else 1.0
        link_c, cpu_c = link * scale, cpu * scale
    return Hardware(str(data.get("name", default_name)), link, cpu, link_c, cpu_c, device, str(data.get("description", "")))
