"""DeepSeek-V4's compressed attention branches and their per-sequence state.

A compressor turns every `rate` consecutive tokens into one compressed KV entry: a softmax
(over the window, per feature) of gate + learned position bias weights the projected values,
then RMSNorm and rope at the window's first position.
  HCA (heavily compressed, e.g. rate 128): disjoint windows, every past entry is attended.
  CSA (compressed sparse, e.g. rate 4): each token projects two series; entry w pools window
      w's second series with window w-1's first (overlapping windows, stride `rate`), and a
      lightning indexer (its own small compressor over the same windows) picks the
      `index_topk` entries each query attends.
Entry j covers tokens [j*rate, (j+1)*rate): a query at position p sees entries j < (p+1)//rate.

`CompressorState` is what one sequence carries per compressor between steps: the tokens of
the unfinished window, the previous window's first series (CSA), and the entries so far.
It snapshots/restores like the recurrent states (`layers/state.py`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..host_copy import to_host
from ..linear import Linear
from ..norm import rms_norm


def rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4 rope: interleaved pairs (x0, x1), (x2, x3) of the *last* 2*cos.shape[-1]
    features rotated in float32; cos/sin [N, pairs] broadcast over any middle dims of x [N, .., D]."""
    r = 2 * cos.shape[-1]
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    rope = x[..., -r:].float()
    a, b = rope[..., 0::2], rope[..., 1::2]
    rot = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return torch.cat([x[..., :-r], rot.to(x.dtype)], dim=-1)


class CompressorState:
    """One sequence's state of one compressor. buf_kv/buf_gate [rate, width] hold the
    `nbuf` tokens of the open window (rows past nbuf kept zero); overlap_kv/overlap_gate
    [rate, dim] the last closed window's first series (CSA, `has_overlap`); entries
    [capacity, dim] the `count` compressed entries."""

    def __init__(self, rate: int, width: int, dim: int, capacity: int, overlap: bool, dtype, device):
        self.rate, self.dim = rate, dim
        self.buf_kv = torch.zeros(rate, width, dtype=torch.float32, device=device)
        self.buf_gate = torch.zeros_like(self.buf_kv)
        self.overlap_kv = torch.zeros(rate if overlap else 0, dim, dtype=torch.float32, device=device)
        self.overlap_gate = torch.zeros_like(self.overlap_kv)
        self.entries = torch.zeros(capacity, dim, dtype=dtype, device=device)
        self.nbuf = self.count = self.position = 0
        self.has_overlap = False

    _fixed = ("buf_kv", "buf_gate", "overlap_kv", "overlap_gate")

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, t).nbytes for t in self._fixed) + self.entries[:self.count].nbytes

    @torch.inference_mode()
    def snapshot(self) -> "CompressorState":
        snap = object.__new__(CompressorState)
        snap.__dict__.update(self.__dict__)
        names = self._fixed + ("entries",)
        snap.host = to_host([getattr(self, t) for t in self._fixed] + [self.entries[:self.count]])
        for t, host in zip(names, snap.host.tensors):    # in host memory, copied asynchronously
            setattr(snap, t, host)
        return snap

    @torch.inference_mode()
    def restore(self, snap: "CompressorState") -> None:
        snap.host.copy_back([getattr(self, t) for t in self._fixed] + [self.entries[:snap.count]])
        self.entries[snap.count:].zero_()
        self.nbuf, self.count, self.has_overlap, self.position = snap.nbuf, snap.count, snap.has_overlap, snap.position

    @torch.inference_mode()
    def reset(self) -> None:
        for t in self._fixed + ("entries",):
            getattr(self, t).zero_()
        self.nbuf = self.count = self.position = 0
        self.has_overlap = False


class Compressor:
    """Weights `{p}.wkv`, `{p}.wgate` (fp32), `{p}.ape` position bias [rate, width] and
    `{p}.norm`; `overlap` for CSA's two-series windows (width = 2 * dim)."""

    def __init__(self, get, p: str, hidden: int, dim: int, rate: int, overlap: bool, eps: float, pool):
        width = 2 * dim if overlap else dim
        self.dim, self.rate, self.overlap, self.eps = dim, rate, overlap, eps
        lin = lambda n: Linear(get(f"{p}.{n}.weight", (width, hidden)), compute_dtype=torch.float32,  # noqa: E731
                               storage_dtype=torch.float32, pool=pool)
        self.wkv, self.wgate = lin("wkv"), lin("wgate")
        self.ape = get(f"{p}.ape", (rate, width))
        self.norm = get(f"{p}.norm.weight", (dim,))

    def make_state(self, capacity: int, dtype, device) -> CompressorState:
        return self.new_state(self.rate, self.dim, self.overlap, capacity, dtype, device)

    @staticmethod
    def new_state(rate: int, dim: int, overlap: bool, capacity: int, dtype, device) -> CompressorState:
        """A sequence's state for a compressor of these sizes (read from the config alone)."""
        return CompressorState(rate, 2 * dim if overlap else dim, dim, capacity, overlap, dtype, device)

    @torch.inference_mode()
    def step(self, st: CompressorState, x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor):
        """Absorb one sequence's new tokens x [n, hidden]; returns all its entries [count, dim]."""
        m, d = self.rate, self.dim
        kv = torch.cat([st.buf_kv[:st.nbuf], self.wkv(x.float())])
        gate = torch.cat([st.buf_gate[:st.nbuf], self.wgate(x.float())])
        usable = kv.shape[0] // m * m
        left = kv.shape[0] - usable
        st.buf_kv.zero_()
        st.buf_gate.zero_()
        st.buf_kv[:left], st.buf_gate[:left], st.nbuf = kv[usable:], gate[usable:], left
        if usable:
            w = usable // m
            ck = kv[:usable].view(w, m, -1)
            cg = gate[:usable].view(w, m, -1) + self.ape
            if self.overlap:
                pk = ck.new_zeros(w, 2 * m, d)
                pg = cg.new_full((w, 2 * m, d), float("-inf"))
                pk[:, m:], pg[:, m:] = ck[..., d:], cg[..., d:]
                pk[1:, :m], pg[1:, :m] = ck[:-1, :, :d], cg[:-1, :, :d]
                if st.has_overlap:
                    pk[0, :m], pg[0, :m] = st.overlap_kv, st.overlap_gate
                st.overlap_kv.copy_(ck[-1, :, :d])
                st.overlap_gate.copy_(cg[-1, :, :d])
                st.has_overlap = True
                ck, cg = pk, pg
            pooled = rms_norm((ck * torch.softmax(cg, dim=1)).sum(dim=1), self.norm, self.eps)
            pos = torch.arange(w, device=x.device) * m + st.count * m
            pooled = rope_tail(pooled, cos_table[pos], sin_table[pos])
            st.entries[st.count:st.count + w] = pooled.to(st.entries.dtype)
            st.count += w
        return st.entries[:st.count]


def visible(positions: torch.Tensor, count: int, rate: int) -> torch.Tensor:
    """[n, count] True where the query at each position may see entry j: j < (p + 1) // rate."""
    return torch.arange(count, device=positions.device)[None] < ((positions + 1) // rate)[:, None]


class V4Indexer:
    """CSA's lightning indexer: its own overlapping compressor at `index_head_dim`, queries
    from the attention's q latent (`wq_b`), compress-rope on both, head weights `weights_proj`.
    score(s, j) = sum_h w[s, h] / sqrt(H) * relu(q[s, h] . K[j]) / sqrt(d)."""

    def __init__(self, get, lin, linear, p: str, hidden: int, q_lora: int, heads: int, dim: int, rate: int, topk: int,
                 eps: float, device):
        self.heads, self.dim, self.topk, self.rate = heads, dim, topk, rate
        self.compressor = Compressor(get, f"{p}.compressor", hidden, dim, rate, True, eps, linear.pool)
        self.wq_b = lin(f"{p}.wq_b.weight", (heads * dim, q_lora))
        self.weights_proj = Linear(get(f"{p}.weights_proj.weight", (heads, hidden)), compute_dtype=torch.float32,
                                   storage_dtype=torch.float32, pool=linear.pool)

    def select(self, st: CompressorState, x, q_latent, positions, cos, sin, cos_table, sin_table) -> torch.Tensor:
        """[n, count] True at the entries each of the sequence's n new queries attends."""
        keys = self.compressor.step(st, x, cos_table, sin_table).float()
        n = x.shape[0]
        vis = visible(positions, keys.shape[0], self.rate)
        if keys.shape[0] == 0:
            return vis
        q = rope_tail(self.wq_b(q_latent).view(n, self.heads, self.dim), cos, sin).float()
        scores = F.relu(torch.einsum("nhd,td->nht", q, keys)) * self.dim ** -0.5
        w = self.weights_proj(x.float()).float() * self.heads ** -0.5
        index = (scores * w.unsqueeze(-1)).sum(dim=1).masked_fill(~vis, float("-inf"))
        top = index.topk(min(self.topk, keys.shape[0]), dim=-1).indices
        return torch.zeros_like(vis).scatter_(1, top, True) & vis
