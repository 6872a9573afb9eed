"""Time of one MoE layer of one decode step, given how its routed experts are served.

``hits`` run on the device from the cache; ``fills`` are copied over the link and then
run on the device; ``cpu`` misses run on the CPU from host memory. Copies and the CPU
branch overlap and share host memory: while both run they move at the concurrent
rates, and whichever finishes first leaves the other at its solo rate. Hits run
while copies stream; fills run after their copies land. All expert reads are memory
bound: an expert costs ``expert_bytes / bandwidth``.
"""

from __future__ import annotations

from freetoken.sim.hardware import Hardware

GB = 1e9


def overlapped(link_bytes: float, cpu_bytes: float, hw: Hardware) -> tuple[float, float]:
    """(link finish, CPU finish) in seconds, both branches starting together."""
    if not link_bytes:
        return 0.0, cpu_bytes / (hw.cpu_gbps * GB)
    if not cpu_bytes:
        return link_bytes / (hw.link_gbps * GB), 0.0
    t_link = link_bytes / (hw.link_concurrent_gbps * GB)
    t_cpu = cpu_bytes / (hw.cpu_concurrent_gbps * GB)
    if t_link <= t_cpu:
        left = cpu_bytes - t_link * hw.cpu_concurrent_gbps * GB
        return t_link, t_link + left / (hw.cpu_gbps * GB)
    left = link_bytes - t_cpu * hw.link_concurrent_gbps * GB
    return t_cpu + left / (hw.link_gbps * GB), t_cpu


def layer_time(hits: int, fills: int, cpu: int, expert_bytes: float, dense_bytes: float, hw: Hardware) -> float:
    per_expert_device = expert_bytes / (hw.device_gbps * GB)
    link_done, cpu_done = overlapped(fills * expert_bytes, cpu * expert_bytes, hw)
    device_done = max(hits * per_expert_device, link_done) + fills * per_expert_device
    return max(device_done, cpu_done) + dense_bytes / (hw.device_gbps * GB)
