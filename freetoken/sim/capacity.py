"""Cache capacity: a fraction of all (layer, expert) entries, or a number of slots."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Capacity:
    requested: float | int  # echoed in reports: 0.37 for a fraction, 512 for slots
    slots: int


def parse_capacity(text: str, universe: int) -> Capacity:
    """'0.37' or '37%' is a fraction of L*E (rounded half up); '512' is a slot count."""
    t = text.strip()
    try:
        if t.endswith("%"):
            frac = float(t[:-1]) / 100
        elif any(ch in t for ch in ".eE"):
            frac = float(t)
        else:
            slots = int(t)
            if slots < 0:
                raise ValueError
            return Capacity(slots, slots)
    except ValueError:
        raise ValueError(f"capacity {text!r} is neither a fraction (0.37, 37%) nor a slot count (512)") from None
    if not 0 <= frac <= 1 or math.isnan(frac):
        raise ValueError(f"capacity {text!r}: a fraction must lie in [0, 1]")
    return Capacity(frac, math.floor(frac * universe + 0.5))
