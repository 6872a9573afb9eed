"""Expert-cache policies compared at equal capacity; ``POLICIES`` maps CLI names to classes.

``lru``, ``lfu``, ``lrfu``, ``arc`` (and their ``+admit`` variants, and ``default``) are the
engine's own `SlotTable` replayed (policies/slot_table.py); the others are study policies that only
the simulator has; ``belady`` is the offline bound (a miss may bypass the cache) and
``belady-no-bypass`` classic demand-paging MIN; ``belady-on-use`` the
optimum of every policy that loads an expert only when it is routed (bypass allowed, no prefetch); ``static-oracle`` the best fixed placement
in hindsight (the bound of frequency ranking); ``default+oracle-prefetch`` the default with a perfect
next-layer guess (the bound of every next-layer predictor at the default's copy budget).
"""

from freetoken.experts.memory.slots import DEFAULT_POLICY
from freetoken.sim.policies.base import Policy
from freetoken.sim.policies.belady import Belady
from freetoken.sim.policies.belady_demand import BeladyDemand
from freetoken.sim.policies.belady_on_use import BeladyOnUse
from freetoken.sim.policies.frequency_oracle import FrequencyOracle
from freetoken.sim.policies.hot_placement import HotPlacement
from freetoken.sim.policies.oracle_prefetch import OraclePrefetch
from freetoken.sim.policies.per_layer_lru import PerLayerLRU
from freetoken.sim.policies.slot_table import slot_policy
from freetoken.sim.policies.static_split import StaticSplit

_ENGINE = {n: slot_policy(n, n) for n in ("lru", "lfu", "lrfu", "arc", "lfu+admit", "lrfu+admit", "arc+admit",
                                          "lru+prefetch", "lrfu+admit+prefetch", "lru+layer", "lfu+layer",
                                          "lrfu+layer", "lrfu+admit+layer", "lrfu+admit+layer+prefetch",
                                          "lrfu+layer+prefetch", "lrfu+admit+layer+prefetch+budget",
                                          "lrfu+layer+prefetch+budget", "lrfu+prompt", "lrfu+admit+prompt",
                                          "lrfu+admit+layer+prompt", "lrfu+admit+layer+prefetch+budget+prompt",
                                          "lrfu+admit+layer+prefetch+budget+prompt+path")}
_ENGINE["default"] = slot_policy("default", DEFAULT_POLICY)

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (_ENGINE["lru"], PerLayerLRU, HotPlacement, StaticSplit, _ENGINE["lfu"], _ENGINE["arc"],
                        _ENGINE["lrfu"], _ENGINE["lfu+admit"], _ENGINE["lrfu+admit"], _ENGINE["arc+admit"],
                        _ENGINE["lru+prefetch"], _ENGINE["lrfu+admit+prefetch"], _ENGINE["lru+layer"],
                        _ENGINE["lfu+layer"], _ENGINE["lrfu+layer"], _ENGINE["lrfu+admit+layer"],
                        _ENGINE["lrfu+admit+layer+prefetch"], _ENGINE["lrfu+layer+prefetch"],
                        _ENGINE["lrfu+admit+layer+prefetch+budget"], _ENGINE["lrfu+layer+prefetch+budget"],
                        _ENGINE["lrfu+prompt"], _ENGINE["lrfu+admit+prompt"], _ENGINE["lrfu+admit+layer+prompt"],
                        _ENGINE["lrfu+admit+layer+prefetch+budget+prompt"],
                        _ENGINE["lrfu+admit+layer+prefetch+budget+prompt+path"], _ENGINE["default"], Belady, BeladyDemand,
                        BeladyOnUse, FrequencyOracle, OraclePrefetch)
}


def parse_policies(text: str) -> list[str]:
    """'all', one name, or a comma list; unknown names raise ValueError."""
    names = list(POLICIES) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or text!r}; choose from {', '.join(POLICIES)} or all")
    return names
