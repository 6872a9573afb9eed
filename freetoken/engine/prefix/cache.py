"""Radix prefix tree over the paged KV, with state checkpoints for hybrid models.

A node is one KV block: the `tokens` it holds (a full block, or fewer in a leaf left by a
finished sequence), the `block` id, its children keyed by their token tuples. The path from
the root spells a token prefix; the node's block holds that prefix's K/V at those positions.

Invariants (checked by `check()` and the property tests):
- only full nodes have children; a node's start position is `block_size * depth`;
- the tree holds one reference on each node's block (`BlockManager.cached`);
- a sequence that holds a tree node's block holds every ancestor's block too (it reuses or
  inserts whole root paths), so the blocks only the tree holds form whole subtrees: evicting
  unreferenced leaves bottom-up can reclaim every one of them;
- a checkpoint at position p (the state after tokens[:p]) hangs on the node holding token
  p-1, and disappears with it.

Sequences use the tree at three moments: `admit` (match the longest cached prefix, share its
full blocks, copy the rows of a partially matched block into a private one, restore the
deepest checkpoint for hybrid models), `after_step` (publish newly completed full blocks so
concurrent requests share them; snapshot planned checkpoints) and `release` (on finish,
abort or preemption: publish everything computed, the tail block and a final checkpoint,
then drop the sequence's references). Unreferenced leaves are evicted LRU on demand.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from ..block_manager import BlockManager
from .checkpoint_policy import CheckpointPolicy
from ..sequence import Sequence


@dataclass(eq=False)
class Checkpoint:
    position: int
    state: object                 # a detached `snapshot()` of the sequence state
    nbytes: int
    last_use: int
    hits: int = 0


@dataclass(eq=False)
class Node:
    tokens: tuple
    block: int
    parent: "Node | None"
    start: int
    children: dict = field(default_factory=dict)
    checkpoints: dict = field(default_factory=dict)       # position -> Checkpoint
    last_access: int = 0
    alive: bool = True

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass
class PrefixStats:
    hit_tokens: int = 0           # prompt tokens served from the tree at admission
    miss_tokens: int = 0          # prompt tokens that had to be computed at admission
    evicted_blocks: int = 0
    evicted_checkpoints: int = 0
    restored_checkpoints: int = 0


class PrefixCache:
    def __init__(self, blocks: BlockManager, *, enabled: bool = True, policy: CheckpointPolicy | None = None,
                 state_budget_bytes: int = 0, make_state=None):
        self.blocks = blocks
        self.bs = blocks.block_size
        self.enabled = enabled
        self.policy = policy or CheckpointPolicy()
        self.state_budget = state_budget_bytes
        self.make_state = make_state           # () -> fresh sequence state, None for plain attention
        self.root = Node((), 0, None, 0)
        self.stats = PrefixStats()
        self.num_nodes = 0
        self.checkpoint_bytes = 0
        self.num_checkpoints = 0
        self._tick = itertools.count(1)
        self._lru: list = []                   # (last_access, seq no, node) of leaves that may be evictable
        self._seq = itertools.count()
        self._node_of: dict[int, Node] = {}    # block -> node
        if enabled:
            blocks.reclaimer = self

    # --- matching ------------------------------------------------------------------------
    def _touch(self, node: Node) -> None:
        node.last_access = next(self._tick)
        if self.blocks.ref[node.block] == 1 and not node.children:   # keep its LRU entry current
            heapq.heappush(self._lru, (node.last_access, next(self._seq), node))

    def match(self, tokens, limit: int) -> tuple[list[Node], Node | None, int]:
        """(full nodes of the longest cached block path, partially matched node or None,
        matched tokens), looking at tokens[:limit] only."""
        bs, node, pos, path = self.bs, self.root, 0, []
        while pos + bs <= limit:
            child = node.children.get(tuple(tokens[pos:pos + bs]))
            if child is None or len(child.tokens) < bs:
                break
            path.append(child)
            node, pos = child, pos + bs
        best, best_k = None, 0
        want = tokens[pos:min(pos + bs, limit)]
        for child in node.children.values():
            k = _common_prefix(child.tokens, want)
            if k > best_k:
                best, best_k = child, k
        return path, best, pos + best_k

    def _deepest_checkpoint(self, path: list[Node], partial: Node | None, upto: int) -> Checkpoint | None:
        for node in ([partial] if partial is not None else []) + path[::-1]:
            usable = [c for p, c in node.checkpoints.items() if p <= upto]
            if usable:
                return max(usable, key=lambda c: c.position)
        return None

    # --- sequence hooks ------------------------------------------------------------------
    def admit(self, seq: Sequence) -> None:
        """Reuse the longest cached prefix of a sequence that starts from scratch."""
        seq.tree_path = []
        seq.checkpoint_plan = []
        seq.pending_checkpoints = {}
        if not self.enabled:
            return
        tokens = seq.all_ids
        hybrid = self.make_state is not None
        reuse = 0
        if not seq.want_prompt_logits:
            path, partial, m = self.match(tokens, len(tokens) - 1)
            cp = self._deepest_checkpoint(path, partial, m) if hybrid else None
            reuse = cp.position if hybrid and cp is not None else (0 if hybrid else m)
            if reuse and not self._share(seq, path, partial, reuse):
                # no block free for the partly matched rows: whole blocks only (plain attention)
                reuse = 0 if hybrid else reuse - reuse % self.bs
                if reuse:
                    self._share(seq, path, None, reuse)
            if hybrid and reuse:
                seq.state = self.make_state()
                seq.state.restore(cp.state)
                cp.hits += 1
                cp.last_use = next(self._tick)
                self.stats.restored_checkpoints += 1
        seq.num_computed = reuse
        if hybrid:
            seq.checkpoint_plan = self.policy.plan(tokens, reuse, len(seq.prompt_ids))

    def _share(self, seq: Sequence, path: list[Node], partial: Node | None, reuse: int) -> bool:
        """Take the first `reuse` tokens from the tree: whole blocks by reference, the rest of a
        block by copying its rows (done by the runner before the next forward pass). False,
        with nothing taken, when no block is left for that copy."""
        nfull, rem = divmod(reuse, self.bs)
        if rem:
            src = path[nfull] if nfull < len(path) else partial
            for node in path[:nfull]:
                self.blocks.incref(node.block)        # pin before `take` may evict
            self.blocks.incref(src.block)
            if not self.blocks.free and self.blocks.reclaimable == 0:
                for node in path[:nfull]:
                    self.blocks.decref(node.block)
                self.blocks.decref(src.block)
                return False
            dst = self.blocks.take()
            seq.pending_copies.append((src.block, dst, rem))
        else:
            for node in path[:nfull]:
                self.blocks.incref(node.block)
        for node in path[:nfull]:
            self._touch(node)
        seq.block_table = [n.block for n in path[:nfull]] + ([dst] if rem else [])
        seq.tree_path = list(path[:nfull])
        return True

    def copies_done(self, seq: Sequence) -> None:
        """The runner copied the partial-block rows: unpin their sources."""
        for src, _, _ in seq.pending_copies:
            self.blocks.decref(src)
        seq.pending_copies = []

    def undo_admit(self, seq: Sequence) -> None:
        """Admission did not go through (no room for the rest): drop what `admit` took."""
        self.copies_done(seq)
        self.blocks.release(seq)
        seq.num_computed = 0
        seq.state = None
        seq.tree_path = []

    def next_stop(self, seq: Sequence) -> int | None:
        """The next position where the sequence's prefill must pause for a checkpoint."""
        for p in seq.checkpoint_plan:
            if p > seq.num_computed:
                return p
        return None

    def after_step(self, seq: Sequence) -> None:
        if not self.enabled:
            return
        if seq.state is not None and seq.num_computed in seq.checkpoint_plan:
            seq.pending_checkpoints[seq.num_computed] = seq.state.snapshot()
        self._publish(seq, seq.num_computed // self.bs)

    def release(self, seq: Sequence, final: bool = False, publish: bool = True) -> None:
        """Finish, abort (`final`) or preemption: leave everything computed in the tree (unless
        not `publish`: a request that failed), then let go."""
        if final:
            self.stats.hit_tokens += seq.num_cached_tokens
            self.stats.miss_tokens += seq.prompt_computed
        self.copies_done(seq)
        if self.enabled and publish and seq.num_computed > 0:
            if seq.state is not None and self.make_state is not None:
                seq.pending_checkpoints.setdefault(seq.num_computed, seq.state.snapshot())
            self._publish(seq, seq.num_computed // self.bs)
            self._publish_tail(seq)
            self._attach_checkpoints(seq)
        seq.pending_checkpoints = {}
        seq.tree_path = []
        self.blocks.release(seq)

    def stats_dict(self) -> dict:
        return {"hit_tokens": self.stats.hit_tokens, "miss_tokens": self.stats.miss_tokens,
                "cached_blocks": self.num_nodes, "evicted_blocks": self.stats.evicted_blocks,
                "checkpoints": self.num_checkpoints, "checkpoint_bytes": self.checkpoint_bytes,
                "evicted_checkpoints": self.stats.evicted_checkpoints,
                "restored_checkpoints": self.stats.restored_checkpoints}

    # --- insertion -----------------------------------------------------------------------
    def _publish(self, seq: Sequence, nblocks: int) -> None:
        """Insert the sequence's full blocks [len(tree_path), nblocks) under its path."""
        if nblocks <= len(seq.tree_path):
            if seq.pending_checkpoints:
                self._attach_checkpoints(seq)
            return
        tokens, bs = seq.all_ids, self.bs
        parent = seq.tree_path[-1] if seq.tree_path else self.root
        for i in range(len(seq.tree_path), nblocks):
            key = tuple(tokens[i * bs:(i + 1) * bs])
            node = parent.children.get(key)
            own = seq.block_table[i]
            if node is None:
                node = self._add(parent, key, own)
                self._absorb_partial_siblings(parent, node)
            elif node.block != own:            # computed twice: keep the tree's copy
                self.blocks.incref(node.block)
                self.blocks.decref(own)
                seq.block_table[i] = node.block
            self._touch(node)
            seq.tree_path.append(node)
            parent = node
        if seq.pending_checkpoints:
            self._attach_checkpoints(seq)

    def _publish_tail(self, seq: Sequence) -> None:
        """A finished sequence's last, partly filled block becomes a leaf (unless a cached
        sibling already holds those tokens)."""
        n = seq.num_computed - len(seq.tree_path) * self.bs
        if n <= 0 or len(seq.tree_path) >= len(seq.block_table):
            return
        start = len(seq.tree_path) * self.bs
        key = tuple(seq.all_ids[start:start + n])
        parent = seq.tree_path[-1] if seq.tree_path else self.root
        node = next((c for c in parent.children.values() if c.tokens[:n] == key), None)
        if node is None:
            node = self._add(parent, key, seq.block_table[len(seq.tree_path)])
        self._touch(node)
        seq.tree_path.append(node)

    def _absorb_partial_siblings(self, parent: Node, full: Node) -> None:
        """A finished request's tail block is a partial leaf; once a full block extends the
        same tokens, its checkpoints move there (a match walks the full node) and the partial
        leaf goes, unless a sequence still holds it."""
        n = len(full.tokens)
        for sib in [c for c in parent.children.values() if len(c.tokens) < n and full.tokens[:len(c.tokens)] == c.tokens]:
            for pos, cp in sib.checkpoints.items():
                full.checkpoints.setdefault(pos, cp)
                if full.checkpoints[pos] is not cp:          # (one there already)
                    self.checkpoint_bytes -= cp.nbytes
                    self.num_checkpoints -= 1
            sib.checkpoints = {}
            if self.blocks.ref[sib.block] == 1:
                self._evict(sib)
                self.stats.evicted_blocks -= 1              # merged, not evicted for room

    def _add(self, parent: Node, key: tuple, block: int) -> Node:
        node = Node(key, block, parent, parent.end)
        parent.children[key] = node
        self.blocks.mark_cached(block)
        self._node_of[block] = node
        self.num_nodes += 1
        return node

    def _attach_checkpoints(self, seq: Sequence) -> None:
        """Hang pending snapshots on the path nodes that now hold their last token."""
        path, added = seq.tree_path, False
        for pos in sorted(seq.pending_checkpoints):
            idx = (pos - 1) // self.bs
            if idx >= len(path) or path[idx].end < pos:
                continue                                   # its block is not in the tree yet
            snap = seq.pending_checkpoints.pop(pos)
            node = path[idx]
            if pos not in node.checkpoints:
                node.checkpoints[pos] = Checkpoint(pos, snap, snap.nbytes, next(self._tick))
                self.checkpoint_bytes += snap.nbytes
                self.num_checkpoints += 1
                added = True
        if added:
            self._trim_path(path)
            self._trim_budget()

    # --- checkpoint budget ---------------------------------------------------------------
    def _drop_checkpoint(self, node: Node, pos: int) -> None:
        cp = node.checkpoints.pop(pos)
        self.checkpoint_bytes -= cp.nbytes
        self.num_checkpoints -= 1
        self.stats.evicted_checkpoints += 1

    def _trim_path(self, path: list[Node]) -> None:
        """At most `policy.per_session` checkpoints along one root-to-leaf path (a session)."""
        on_path = [(node, cp) for node in path for cp in node.checkpoints.values()]
        for node, cp in self.policy.to_drop(on_path, lambda n: len(n.children) > 1):
            self._drop_checkpoint(node, cp.position)

    def _trim_budget(self) -> None:
        if self.checkpoint_bytes <= self.state_budget:
            return
        every = [(cp.last_use, cp.position, id(node), node) for node in self._all_nodes() for cp in node.checkpoints.values()]
        for _, pos, _, node in sorted(every, key=lambda t: t[:3]):
            if self.checkpoint_bytes <= self.state_budget:
                break
            self._drop_checkpoint(node, pos)

    def _all_nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    # --- eviction (BlockManager.reclaimer) -----------------------------------------------
    def unpinned(self, block: int) -> None:
        node = self._node_of.get(block)
        if node is not None and not node.children:
            heapq.heappush(self._lru, (node.last_access, next(self._seq), node))

    def reclaim(self, n: int) -> int:
        """Evict up to n least recently used leaves that no sequence holds."""
        freed = 0
        while freed < n and self._lru:
            stamp, _, node = heapq.heappop(self._lru)
            if (not node.alive or node.children or stamp != node.last_access
                    or self.blocks.ref[node.block] != 1):
                continue
            parent = node.parent
            self._evict(node)
            freed += 1
            if parent is not self.root and not parent.children and self.blocks.ref[parent.block] == 1:
                heapq.heappush(self._lru, (parent.last_access, next(self._seq), parent))
        if len(self._lru) > 4 * self.num_nodes + 64:       # drop stale entries now and then
            self._lru = [e for e in self._lru if e[2].alive]
            heapq.heapify(self._lru)
        return freed

    def _evict(self, node: Node) -> None:
        for pos in list(node.checkpoints):
            self._drop_checkpoint(node, pos)
        del node.parent.children[node.tokens]
        del self._node_of[node.block]
        node.alive = False
        self.num_nodes -= 1
        self.stats.evicted_blocks += 1
        self.blocks.decref(node.block)

    # --- elastic memory (engine/resize.py) -----------------------------------------------
    def set_state_budget(self, nbytes: int) -> int:
        """A new checkpoint budget; shrinking drops the least recently used snapshots first.
        Returns how many were dropped."""
        before = self.stats.evicted_checkpoints
        self.state_budget = int(nbytes)
        self._trim_budget()
        return self.stats.evicted_checkpoints - before

    def relocate(self, moves: dict[int, int]) -> None:
        """KV blocks moved (pool compaction): tree nodes follow their block."""
        for b, d in moves.items():
            node = self._node_of.pop(b, None)
            if node is not None:
                node.block = d
                self._node_of[d] = node

    # --- invariants (tests) --------------------------------------------------------------
    def check(self) -> None:
        count, cp_bytes = 0, 0
        for node in self._all_nodes():
            count += 1
            assert node.alive and self.blocks.cached[node.block] and self.blocks.ref[node.block] >= 1
            assert self._node_of[node.block] is node
            assert node.start == node.parent.end and node.parent.children[node.tokens] is node
            assert not node.children or len(node.tokens) == self.bs
            if self.blocks.ref[node.block] > 1 and node.parent is not self.root:
                assert self.blocks.ref[node.parent.block] > 1, "a held node under an unheld parent"
            for p, cp in node.checkpoints.items():
                assert node.start < p <= node.end and cp.position == p
                cp_bytes += cp.nbytes
        assert count == self.num_nodes == len(self._node_of)
        assert cp_bytes == self.checkpoint_bytes
        tree_only = sum(1 for b in range(self.blocks.num_blocks) if self.blocks.cached[b] and self.blocks.ref[b] == 1)
        assert tree_only == self.blocks.reclaimable


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
