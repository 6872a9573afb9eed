"""What the front end sends an engine replica: one HTTP request, plus what the router
reads to place it (the prompt's block hashes, the session) or the replica it must go to
(metrics and health of one replica)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Forward:
    method: str
    path: str
    query: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    key: list[int] | None = None       # chain hashes of the prompt's token blocks (table.block_hashes)
    session: str | None = None
    target: str | None = None          # a replica id: only that replica may take it
    avoid: str | None = None           # a replica that just failed this request


# what a replica's stream yields besides body bytes
HELLO = "replica"      # ("replica", id): first, so the front end knows who serves it
START = "start"        # ("start", status, [(name, value), ...])
META = "meta"          # ("meta", {"replica", "evicted_blocks", "kv_blocks_total", "block_size"})
