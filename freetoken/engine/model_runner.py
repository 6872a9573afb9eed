"""Turns a scheduled batch into model inputs (ids, positions, paged-attention metadata),
runs the model, and returns the logits of the positions that are sampled."""
from __future__ import annotations

import weakref

import torch

from ..layers.attention.paged import AttentionMetadata, KVCache
from ..layers.kernel_rows import GEMV_TOKENS
from ..models.context import ForwardContext
from .cuda_graphs import PAD_POS as _PAD_POS, DecodeGraphs, cuda_capture
from .sequence import Sequence

# torch's thread count is the process's, so is the caller's setting a runner changes it from: saved by
# the first runner that changes it (an engine's, or a draft model's inside that engine's step), given
# back by whichever idles first (a draft model's runner saving its own would keep the target's decode
# setting, one thread, as the caller's)
_caller_threads: dict[str, int | None] = {"n": None}


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, graphs: dict | None = None):
        """graphs: decode CUDA graphs (cuda_graphs.py), {"max_batch": N, "max_model_len": L} and
        optionally "capture" (tests: cuda_graphs.eager_capture); None: every step eager."""
        self.model = model
        self.block_size = block_size
        self.device = model.device
        slots = num_blocks * block_size
        # kv_layers(): (layer, kv heads, head dim) or (layer, 1, row size, False) for a latent
        # cache that keeps one row per token and no values (MLA)
        self.kv = {i: KVCache(slots, h, d, model.kv_dtype, model.device, *rest) for i, h, d, *rest in model.kv_layers()}
        self._arange = torch.arange(block_size)
        self._key_pos = torch.arange(0).unsqueeze(0)         # (`_key_positions`)
        self._query_index: dict[int, torch.Tensor] = {}     # a decode step's [b, 1] query rows 0..b-1, by b
        self._slot_rows = weakref.WeakKeyDictionary()     # sequence -> (block table, its slots): `_slots`
        # the CPU kernels' pool of a pure-CPU model (None on CUDA): decode attention runs there
        self.kernel_pool = model.linear.pool
        # the lm_head on the C kernels: its GEMV gives each row the same bits in any call
        self._head_gemv = getattr(getattr(model, "lm_head", None), "pool", None) is not None
        self.graphs = None
        if graphs is not None:
            kmax = -(-graphs["max_model_len"] // block_size) * block_size
            self.graphs = DecodeGraphs(self._static_step, graphs["max_batch"], kmax, self.device,
                                       graphs.get("capture", cuda_capture))

    @property
    def kv_nbytes(self) -> int:
        return sum(c.nbytes for c in self.kv.values())

    def _slots(self, seq: Sequence, upto: int) -> torch.Tensor:
        """Cache slots of seq's first `upto` tokens; the table's slots are kept on the sequence
        while its block table stays the same (a decode step appends a block every block_size
        tokens; the prefix cache may swap blocks in place, hence the tuple compare)."""
        key = tuple(seq.block_table)
        cached = self._slot_rows.get(seq)
        if cached is None or cached[0] != key:
            table = torch.tensor(key, dtype=torch.long)
            cached = self._slot_rows[seq] = (key, (table[:, None] * self.block_size + self._arange).reshape(-1))
        return cached[1][:upto]

    def _decode_run(self, batch: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list, list]:
        """`run` for a plain decode step (one new token a sequence, no drafts, no prompt logits):
        the same metadata as the general path, built with a few tensor ops instead of ~25 (at
        one sequence on a small model the general path's bookkeeping was ~0.2 ms a step)."""
        b = len(batch)
        ids, lens = [], []
        for s, _ in batch:
            nc, prompt = s.num_computed, s.prompt_ids
            ids.append(prompt[nc] if nc < len(prompt) else s.output_ids[nc - len(prompt)])
            lens.append(nc + 1)
            if s.state is None:
                s.state = self.model.make_state()
        kmax = max(lens)
        ctx_lens = torch.tensor(lens)
        positions = ctx_lens - 1
        rows = [self._slots(s, n) for (s, _), n in zip(batch, lens)]
        if b == 1:      # (views of the cached slots and key positions: ~10 fewer torch ops a step)
            key_slots = rows[0].unsqueeze(0)
            key_pos = self._key_positions(kmax)
            slot_map = rows[0][kmax - 1:]
        else:
            key_slots = torch.stack([torch.nn.functional.pad(r, (0, kmax - len(r))) for r in rows])
            key_pos = torch.arange(kmax).expand(b, kmax)
            key_pos = torch.where(key_pos < ctx_lens[:, None], key_pos, _PAD_POS)
            slot_map = key_slots.gather(1, positions[:, None]).squeeze(1)
        q_index = self._query_index.get(b)
        if q_index is None:
            q_index = self._query_index[b] = torch.arange(b).unsqueeze(1)
        dev = self.device
        to = (lambda t: t) if dev.type == "cpu" else (lambda t: t.to(dev))    # (a no-op `.to` is a torch call too)
        meta = AttentionMetadata(slot_mapping=to(slot_map), key_slots=to(key_slots), key_positions=to(key_pos),
                                 query_index=to(q_index), query_positions=to(positions.unsqueeze(1)), num_tokens=b,
                                 context_lens=ctx_lens, kernel_pool=self.kernel_pool, block_size=self.block_size)
        ctx = ForwardContext(attn=meta, kv=self.kv, states=[s.state for s, _ in batch],
                             query_lens=[1] * b, phase="decode")
        self._torch_threads("decode")
        hidden = self.model.forward(torch.tensor(ids, device=dev), to(positions), ctx)
        return self.model.compute_logits(hidden), [None] * b, [None] * b

    def _key_positions(self, n: int) -> torch.Tensor:
        """[1, n] key positions 0..n-1: a view of one row kept for every step (read only)."""
        if self._key_pos.shape[1] < n:
            self._key_pos = torch.arange(max(n, 2 * self._key_pos.shape[1])).unsqueeze(0)
        return self._key_pos[:, :n]

    def _verify_run(self, seq: Sequence, n: int) -> tuple[torch.Tensor, list, list]:
        """`run` for one sequence verifying its draft (its pending token and the n - 1 drafted
        ones): the general path's metadata for a batch of one, from a few tensor ops (~0.3 ms
        of bookkeeping a verify step less on the dense bench model)."""
        start = seq.num_computed
        ids = seq.all_ids[start:start + 1] + seq.draft
        if seq.state is None:
            seq.state = self.model.make_state()
        slots = self._slots(seq, start + n)
        positions = torch.arange(start, start + n)
        dev = self.device
        meta = AttentionMetadata(slot_mapping=slots[start:].to(dev), key_slots=slots.unsqueeze(0).to(dev),
                                 key_positions=torch.arange(start + n).unsqueeze(0).to(dev),
                                 query_index=torch.arange(n).unsqueeze(0).to(dev),
                                 query_positions=positions.unsqueeze(0).to(dev), num_tokens=n,
                                 context_lens=torch.tensor([start + n]), kernel_pool=self.kernel_pool,
                                 block_size=self.block_size)
        ctx = ForwardContext(attn=meta, kv=self.kv, states=[seq.state], query_lens=[n], phase="decode")
        self._torch_threads("decode")
        hidden = self.model.forward(torch.tensor(ids, device=dev), positions.to(dev), ctx)
        if self._head_gemv and n <= GEMV_TOKENS:
            rows = self.model.compute_logits(hidden).float()
            return rows[-1:], [None], [rows]
        return self.model.compute_logits(hidden[-1:]), [None], [self.model.compute_logits(hidden).float()]

    @torch.inference_mode()
    def copy_rows(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy the first `rows` token rows of block src into block dst in every KV layer
        (a prefix that ends inside a shared block continues in a private copy)."""
        bs = self.block_size
        for src, dst, rows in copies:
            for c in self.kv.values():
                c.k[dst * bs:dst * bs + rows] = c.k[src * bs:src * bs + rows]
                if c.v is not None:                     # latent caches (MLA) keep one row, no V
                    c.v[dst * bs:dst * bs + rows] = c.v[src * bs:src * bs + rows]

    @torch.inference_mode()
    def resize_kv(self, num_blocks: int, moves: dict[int, int]) -> None:
        """Copy each moved block's rows to its new block, then reallocate every layer's cache
        at `num_blocks` blocks keeping the first rows. One layer at a time, so the peak is the
        whole cache plus one layer's new tensor; on CUDA the freed memory goes back to the driver."""
        bs, rows = self.block_size, num_blocks * self.block_size
        if moves:
            src = torch.tensor(list(moves), dtype=torch.long)
            dst = torch.tensor(list(moves.values()), dtype=torch.long)
            src = (src[:, None] * bs + self._arange).reshape(-1).to(self.device)
            dst = (dst[:, None] * bs + self._arange).reshape(-1).to(self.device)
        for c in self.kv.values():
            for name in ("k", "v"):
                old = getattr(c, name)
                if old is None:
                    continue
                if moves:
                    old.index_copy_(0, dst, old.index_select(0, src))
                keep = min(rows, old.shape[0])
                new = torch.empty((rows, *old.shape[1:]), dtype=old.dtype, device=old.device)
                new[:keep] = old[:keep]
                new[keep:].zero_()
                setattr(c, name, new)
                del old
        if self.graphs is not None:
            self.graphs.reset()                        # captured graphs hold the old addresses
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _torch_threads(self, phase: str) -> None:
        """Pure-CPU decode: every heavy op runs in the kernels' pool and torch's remaining ops are
        tiny, so torch gets one thread while decode steps follow each other; with more, its
        OpenMP workers wake (and spin) on the pool's cores and both stall (measured on 2 cores:
        30.0 -> 21.4 ms per decode step). Switching back per step is not enough: the OpenMP
        workers spin on after every multi-threaded op. Prefill steps run torch on the pool's
        thread count (the engine's num_threads), not on whatever the process was left at: an
        engine dropped mid-decode leaves torch at one thread, and torch's float32 GEMMs sum in
        another order on another count, so a prompt's logits depended on what ran before (the
        resident experts' GEMMs flipped an int8 rounding of the kernels' activations: 19 of 40
        positions off by up to 4.2e-4 of the scale). `idle()` gives the caller's setting back."""
        if self.kernel_pool is None:
            return
        want = 1 if phase == "decode" else self.kernel_pool.num_threads
        now = torch.get_num_threads()
        if now != want:
            if _caller_threads["n"] is None:
                _caller_threads["n"] = now
            torch.set_num_threads(want)

    def idle(self) -> None:
        """Nothing is running: torch gets the caller's threads back."""
        if _caller_threads["n"] is not None:
            torch.set_num_threads(_caller_threads["n"])
            _caller_threads["n"] = None

    def _static_step(self, st, paged: bool | None = None) -> torch.Tensor:
        """One decode step over a bucket's static buffers (cuda_graphs.StaticBatch): fixed shapes,
        no host tensors; what a graph captures. paged: force the in-place attention (tests)."""
        meta = AttentionMetadata(slot_mapping=st.slot_mapping, key_slots=st.key_slots,
                                 key_positions=st.key_positions, query_index=st.query_index,
                                 query_positions=st.query_positions, num_tokens=st.rows, context_lens=None,
                                 kernel_pool=None, block_size=self.block_size, padded_keys=True,
                                 paged=paged)
        ctx = ForwardContext(attn=meta, kv=self.kv, states=[None] * st.rows, query_lens=[1] * st.rows, phase="decode")
        return self.model.compute_logits(self.model.forward(st.ids, st.positions, ctx))

    def _graph_run(self, batch: list[tuple[Sequence, int]]) -> torch.Tensor | None:
        """A decode step as a graph replay, or None (run it eagerly)."""
        if any(n != 1 or s.want_prompt_logits for s, n in batch):
            return None
        ids = torch.tensor([s.all_ids[s.num_computed] for s, _ in batch])
        positions = torch.tensor([s.num_computed for s, _ in batch])
        kmax = max(s.num_computed + 1 for s, _ in batch)
        key_slots = torch.stack([torch.nn.functional.pad(sl, (0, kmax - len(sl))) for sl in
                                 (self._slots(s, s.num_computed + 1) for s, _ in batch)])
        for s, _ in batch:
            if s.state is None:
                s.state = self.model.make_state()
        return self.graphs.run(ids, positions, key_slots.gather(1, positions[:, None]).squeeze(1), key_slots)

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list, list]:
        """Returns (logits of each sequence's last new token [B, V], all-position logits per
        sequence where it asked for prompt logits, else None, the logits [k+1, V] of the
        pending token and the k drafted tokens of each sequence verifying a draft, else None).
        A sequence's new tokens are its pending ones followed by its `draft`. The model's own
        kernel switches are in place meanwhile (kernels/switch_set.py; within its engine's step
        they already are)."""
        with self.model.kernel_switches.installed():
            return self._run(batch)

    def _run(self, batch: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list, list]:
        if self.graphs is not None:
            logits = self._graph_run(batch)
            if logits is not None:
                return logits, [None] * len(batch), [None] * len(batch)
        if all(n == 1 and not s.draft and not s.want_prompt_logits for s, n in batch):
            return self._decode_run(batch)
        if len(batch) == 1 and batch[0][0].draft and batch[0][1] == 1 + len(batch[0][0].draft) \
                and not batch[0][0].want_prompt_logits:
            return self._verify_run(*batch[0])
        ids, pos, slot_map, key_slots, qidx = [], [], [], [], []
        n_total = sum(n for _, n in batch)
        qmax = max(n for _, n in batch)
        kmax = max(s.num_computed + n for s, n in batch)
        offset = 0
        for seq, n in batch:
            start = seq.num_computed
            all_ids = seq.all_ids + seq.draft if seq.draft else seq.all_ids
            ids.extend(all_ids[start:start + n])
            pos.append(torch.arange(start, start + n))
            slots = self._slots(seq, start + n)
            slot_map.append(slots[start:])
            key_slots.append(torch.nn.functional.pad(slots, (0, kmax - len(slots))))
            qidx.append(torch.nn.functional.pad(torch.arange(offset, offset + n), (0, qmax - n), value=n_total))
            offset += n
            if seq.state is None:
                seq.state = self.model.make_state()
        positions = torch.cat(pos)
        ctx_lens = torch.tensor([s.num_computed + n for s, n in batch])
        key_pos = torch.arange(kmax).expand(len(batch), kmax)
        key_pos = torch.where(key_pos < ctx_lens[:, None], key_pos, _PAD_POS)
        q_index = torch.stack(qidx)
        q_pos = torch.cat([positions, torch.tensor([-1])])[q_index]
        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.cat(slot_map).to(dev), key_slots=torch.stack(key_slots).to(dev),
                                 key_positions=key_pos.to(dev), query_index=q_index.to(dev),
                                 query_positions=q_pos.to(dev), num_tokens=n_total, context_lens=ctx_lens,
                                 kernel_pool=self.kernel_pool, block_size=self.block_size)
        # a verify of drafts is a decode step of a few positions a sequence (experts and threads as decode)
        phase = "decode" if qmax == 1 or all(n == 1 + len(s.draft) for s, n in batch) else "prefill"
        ctx = ForwardContext(attn=meta, kv=self.kv, states=[s.state for s, _ in batch],
                             query_lens=[n for _, n in batch], phase=phase)
        self._torch_threads(phase)
        hidden = self.model.forward(torch.tensor(ids, device=dev), positions.to(dev), ctx)
        full = [self.model.compute_logits(hidden[int(q_index[i, 0]):int(q_index[i, n - 1]) + 1]).cpu()
                if seq.want_prompt_logits else None for i, (seq, n) in enumerate(batch)]
        last, verify = self._sampled_logits(hidden, q_index, batch)
        return last, full, verify

    def _sampled_logits(self, hidden, q_index, batch) -> tuple[torch.Tensor, list]:
        """(each sequence's last-position logits [B, V], the verify rows [k+1, V] of each
        sequence with a k-token draft, else None). With drafts on the CPU kernels, the lm_head
        runs once over every row the step samples from (a verifying sequence's last row is its
        verify rows' last), not once for the last rows and again per verify: the vocabulary's
        weights were read twice a verify step, ~7% of the dense bench model's step. The GEMV
        (up to GEMV_TOKENS rows) gives a row the bits it has in any other call; elsewhere (torch
        GEMMs, more rows) the calls stay as they were."""
        ends = [int(q_index[i, n - 1]) for i, (_, n) in enumerate(batch)]
        ks = [len(s.draft) for s, _ in batch]
        sizes = [k + 1 for k in ks]
        if any(ks) and self._head_gemv and sum(sizes) <= GEMV_TOKENS:
            idx = torch.cat([torch.arange(e - k, e + 1) for e, k in zip(ends, ks)])
            parts = self.model.compute_logits(hidden[idx]).float().split(sizes)
            return torch.stack([p[-1] for p in parts]), [p if k else None for p, k in zip(parts, ks)]
        last = self.model.compute_logits(hidden[torch.tensor(ends, device=hidden.device)])
        return last, [self.model.compute_logits(hidden[e - k:e + 1]).float() if k else None for e, k in zip(ends, ks)]
