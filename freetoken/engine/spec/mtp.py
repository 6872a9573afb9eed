"""The checkpoint's MTP ("nextn") layer as a drafter (models/mtp_head.py is the layer itself).

Per sequence it keeps the layer's own KV rows, one per position p, made from the main model's
hidden state h_p and the token at p+1; the engine hands it every forward's hidden states
(`take_hidden`). A proposal first catches up: rows for the positions the main model computed
since the last proposal (the verified ones: hidden states of rejected draft positions are
dropped), the last of which predicts the token after the pending one. Then it chains: the
layer's own output stands in for the main hidden state at the next position, with the token
it just drafted, D-1 more times. Rows made while chaining are speculative: the next catch-up
writes those positions again from the main model's hidden states (that is the rollback on
rejection: `done` never passes the last verified position).

Positions whose hidden state never reached the drafter (a prefix-cache hit, a fallback rerun,
more than MAX_BACKLOG positions without a proposal) cut the layer's context: its attention
restarts at the first position after the gap. Drafts get worse there, never wrong: every
draft is verified. The seconds a proposal takes are measured (`cost`) and priced with the
verify."""
from __future__ import annotations

import time

import torch

from ...layers.attention.paged import AttentionMetadata, KVCache
from .drafters import Draft

MAX_BACKLOG = 4096      # hidden states kept per sequence while it does not draft
STEADY_ROWS = 65        # catch-ups of at most this many rows (1 + accepted drafts) teach the cost
EMA = 0.2


class _SeqState:
    def __init__(self):
        self.hidden: dict[int, torch.Tensor] = {}   # position -> main hidden row (not yet consumed)
        self.base = 0                               # first position with a row in `cache`
        self.done = 0                               # rows [base, done) are from verified hidden states
        self.cache: KVCache | None = None


class MTPDrafter:
    name = "mtp"

    def __init__(self, head):
        self.head = head
        self._seqs: dict = {}
        self.first_s: float | None = None      # catch-up + the first draft, seconds (measured)
        self.next_s: float | None = None       # each chained draft after it, seconds (measured)

    # --- what the engine hands over -------------------------------------------------------
    def take_hidden(self, batch, hidden: torch.Tensor) -> None:
        """After a forward over `batch` [(seq, n)] (seq.num_computed still the first new position):
        keep each sequence's hidden rows by position."""
        offset = 0
        for seq, n in batch:
            st = self._seqs.setdefault(seq.request_id, _SeqState())
            start = seq.num_computed
            for j in range(n):
                st.hidden[start + j] = hidden[offset + j]
            offset += n
            if len(st.hidden) > MAX_BACKLOG:
                for p in sorted(st.hidden)[:len(st.hidden) - MAX_BACKLOG]:
                    del st.hidden[p]

    def observe(self, key, tokens: list[int], start: int) -> None:
        pass

    def forget(self, key) -> None:
        self._seqs.pop(key, None)

    # --- the price's side -------------------------------------------------------------------
    def cost(self, k: int) -> float:
        """Expected seconds to draft k tokens (0 until measured)."""
        if k <= 0 or self.first_s is None:
            return 0.0
        return self.first_s + (k - 1) * (self.next_s or self.first_s)

    def _learn(self, k: int, first: float, rest: float) -> None:
        self.first_s = first if self.first_s is None else (1 - EMA) * self.first_s + EMA * first
        if k > 1:
            per = rest / (k - 1)
            self.next_s = per if self.next_s is None else (1 - EMA) * self.next_s + EMA * per

    # --- drafting ---------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, context: list[int], k: int, key=None) -> Draft | None:
        st = self._seqs.get(key)
        if st is None or k <= 0:
            return None
        t0 = time.perf_counter()
        last = len(context) - 1                 # the pending token's position: rows up to last-1
        caught = self._catch_up(st, context, last)
        if caught is None:
            return None
        h, rows = caught
        tok = int(self.head.logits(h).argmax())
        out = [tok]
        t1 = time.perf_counter()
        for j in range(1, k):                   # speculative rows at last, last+1, ...: `done` stays
            h = self._rows(st, h[None], [tok], last - 1 + j)[-1]
            tok = int(self.head.logits(h).argmax())
            out.append(tok)
        if rows <= STEADY_ROWS:      # a catch-up over a whole prompt is not what a draft costs
            self._learn(k, t1 - t0, time.perf_counter() - t1)
        return Draft(tuple(out), self.name, 0)

    def _catch_up(self, st: _SeqState, context: list[int], last: int) -> tuple[torch.Tensor, int] | None:
        """Rows from the verified hidden states up to position last-1: (the last row's output,
        how many rows ran)."""
        for p in [p for p in st.hidden if p >= last]:        # rejected or not yet verified positions
            del st.hidden[p]
        st.done = min(st.done, last)
        if st.done < st.base:
            st.done = st.base
        todo = list(range(st.done, last))
        if not todo or any(p not in st.hidden for p in todo):
            # a gap: restart the layer's context at the newest run of known positions
            run = last - 1
            while run - 1 in st.hidden:
                run -= 1
            if run not in st.hidden:
                return None
            st.base = st.done = run
            todo = list(range(run, last))
        rows = torch.stack([st.hidden.pop(p) for p in todo])
        for p in [p for p in st.hidden if p < st.done]:
            del st.hidden[p]
        out = self._rows(st, rows, [context[p + 1] for p in todo], todo[0])
        st.done = last
        return out[-1], len(todo)

    def _rows(self, st: _SeqState, hidden: torch.Tensor, next_ids: list[int], start: int) -> torch.Tensor:
        """The layer over rows at positions start.. (their KV rows written), outputs [n, H]."""
        n = len(next_ids)
        end = start + n
        self._ensure(st, end - st.base)
        dev = self.head.model.device
        pos = torch.arange(start, end)
        keys = torch.arange(st.base, end)
        meta = AttentionMetadata(slot_mapping=(pos - st.base + 1).to(dev), key_slots=(keys - st.base + 1)[None].to(dev),
                                 key_positions=keys[None].to(dev), query_index=torch.arange(n)[None].to(dev),
                                 query_positions=pos[None].to(dev), num_tokens=n,
                                 context_lens=torch.tensor([end - st.base]),
                                 kernel_pool=self.head.model.linear.pool)   # the C decode attention on the CPU
        ids = torch.tensor(next_ids, device=dev)
        return self.head.forward(hidden, ids, pos.to(dev), st.cache, meta)

    def _ensure(self, st: _SeqState, rows: int) -> None:
        """The sequence's cache holds at least `rows` rows after its null slot (grown by doubling)."""
        have = 0 if st.cache is None else st.cache.k.shape[0] - 1
        if rows <= have:
            return
        size = max(rows, 2 * have, 64)
        m = self.head.model
        new = KVCache(size + 1, *self.head.kv_row()[:2], m.kv_dtype, m.device, *self.head.kv_row()[2:])
        if st.cache is not None:
            new.k[:have + 1] = st.cache.k
            if new.v is not None:
                new.v[:have + 1] = st.cache.v
        st.cache = new
