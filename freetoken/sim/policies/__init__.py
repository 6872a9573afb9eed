"""Expert-cache policies compared at equal capacity; ``POLICIES`` maps CLI names to classes."""

from freetoken.sim.policies.arc import ARC
from freetoken.sim.policies.base import Policy
from freetoken.sim.policies.belady import Belady
from freetoken.sim.policies.hot_placement import HotPlacement
from freetoken.sim.policies.lfu import LFU
from freetoken.sim.policies.lrfu import LRFU
from freetoken.sim.policies.lru import GlobalLRU
from freetoken.sim.policies.per_layer_lru import PerLayerLRU
from freetoken.sim.policies.static_split import StaticSplit

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (GlobalLRU, PerLayerLRU, HotPlacement, StaticSplit, LFU, ARC, LRFU, Belady)
}


def parse_policies(text: str) -> list[str]:
    """'all', one name, or a comma list; unknown names raise ValueError."""
    names = list(POLICIES) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or text!r}; choose from {', '.join(POLICIES)} or all")
    return names
