"""The tiered backends: `offload` (fill every miss), `hybrid` (q* split) and `cpu`.
Policy `pageable` is what `offload`/`hybrid` become when the host banks cannot be page-locked
(experts/memory/pinning.py): cache hits still run on the device, every miss runs on the CPU, and one
background fill per layer call (on the copy engine's thread) keeps the cache warming.

One MoE layer of one step (`TieredExperts._forward_planned`):
  1-2. the layer's cache decision (decision.py, the same code `freetoken sim` replays):
     hits, in-flight, misses split by the planner, admission, victims, fill waves
  3. start the CPU branch on its worker thread: experts of C (and in-flight ones) run
     from the host pool, residency untouched
  4. the fill branch: take the least-recent candidates in one pass, install the fills and
     start their copies; run the hits on the device meanwhile; when the copies land run
     the fills. If fewer slots are free than fills, the fills go in waves.
  5. sum the gate-weighted partial outputs (exact up to summation order)
  6. with "+prefetch" (decode): start background copies of the next layer's guessed experts;
     with experts expected for the next layer (speculative drafts, memory/expected.py), those too
Each branch's time feeds the bandwidth estimator that sets the next q*.

Prefill with many tokens streams whole layers instead (prefill.py). Decode under lru on a GPU
decides on the device instead, without host syncs (device_path.py); the host table is then
brought up to date at the next prefill, resize or statistics call.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from ..measure.bandwidth import BandwidthEstimator
from ..base import Experts
from ..memory.cache import ExpertCache
from ..memory.decision import decide
from ..memory.expected import ExpectedExperts
from .device_path import DeviceDecisions, applies
from .decode_row import MoERow, RowCounts
from .host_exec import make_host_executor
from ..memory.planner import MissPlanner, SplitGuard
from ..memory.pool import ExpertPool
from .prefill import LayerStreamer
from ..memory.slots import DEFAULT_POLICY, slots_in
from ..measure.stats import ExpertStats
from .resident import SYNC_FREE_PAIRS
from .torch_exec import run_experts, run_slots
from .. import ggml_slots
from ..memory.transfer import CopyEngine, make_copy_engine


class CpuBranch:
    """A persistent worker thread that runs the host executor beside the device branch."""

    def __init__(self, executor):
        self.executor = executor
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="freetoken-cpu-branch")

    def run_here(self, x: torch.Tensor, ids: np.ndarray, w: torch.Tensor):
        """(float32 [T,H] output, seconds) on the calling thread."""
        t0 = time.perf_counter()
        out = self.executor.run(x, torch.from_numpy(ids), w)
        return out, time.perf_counter() - t0

    def submit(self, x: torch.Tensor, ids: np.ndarray, w: torch.Tensor) -> Future:
        return self._pool.submit(self.run_here, x, ids, w)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class TieredExperts(Experts):
    keeps_expert_cache = True

    def __init__(self, pool: ExpertPool, device: torch.device, slots: int, policy: str = "hybrid",
                 host_executor=None, copy_engine: CopyEngine | None = None,
                 estimator: BandwidthEstimator | None = None, stream_prefill: bool = True,
                 device_executor=run_experts, guard: bool = True, cache_policy: str = DEFAULT_POLICY,
                 device_decisions: bool | None = None):
        self.pool, self.spec, self.E = pool, pool.spec, pool.num_experts
        self.device = torch.device(device)
        # `slots` may be a callable: the size is then decided at the first step, once the
        # engine has put its other weights (and KV cache) on the device.
        self._size_later = slots if callable(slots) else None
        self.cache = ExpertCache(pool, 0 if callable(slots) else slots, self.device,
                                 copy_engine or make_copy_engine(self.device), cache_policy)
        self.planner = MissPlanner(pool.num_layers * pool.num_experts, policy)
        if policy == "pageable":            # streaming whole layers from pageable memory would block
            stream_prefill = False
        self.est = estimator or BandwidthEstimator.from_profile(None, self.device)
        self.cpu = CpuBranch(host_executor or make_host_executor(pool))
        self.run_device = device_executor
        self._ggml_types = ggml_slots.pool_types(pool)     # ggml slots: the types per half, read once
        self.streamer = LayerStreamer(self.cache, pool.num_layers, pool.num_experts) if stream_prefill else None
        self.stats_ = ExpertStats(pool.num_layers, policy, num_experts=pool.num_experts)
        self.S = pool.expert_nbytes
        self.phase = "decode"
        self.guard = SplitGuard() if guard and policy == "hybrid" else None
        self._decode_policy: str | None = None       # None: the planner's own (q*)
        self._step_s = 0.0                           # MoE seconds of the current step
        self._fill_jobs: list = []          # (job, extra device seconds) awaiting their link time
        self._host_device = self.device.type == "cpu"
        # decode decisions on the device: by default on CUDA; the CPU tests force them
        self._want_device = self.device.type == "cuda" if device_decisions is None else device_decisions
        self._devpath: DeviceDecisions | None = None
        self.expected = ExpectedExperts()            # experts told ahead (speculative drafts)

    # ---- Experts seam -------------------------------------------------------------------
    def ensure_sized(self) -> None:
        if self._size_later is not None:
            self.cache.resize(self._size_later())
            self._size_later = None

    def begin_step(self, phase: str, tokens: int | None = None) -> None:
        self.ensure_sized()
        if self.streamer is not None:
            self.streamer.release_all()
            if phase == "prefill":
                self.streamer.start(tokens)         # layers 0 and 1 copy during embedding + attention
        if self.guard is not None and self.phase == "decode" and self._step_s > 0:
            self.guard.record(self._step_s)
        self._step_s = 0.0
        if self.guard is not None and phase == "decode" and self.planner.fixed_q is None:
            self._decode_policy = "offload" if self.guard.next_step() == "fill" else None
        self.phase = phase
        self.stats_.step(phase)
        if self._devpath is not None and self._devpath.active:
            self._devpath.lru.end_step()
        else:
            self.planner.end_step()
        self._harvest()
        if phase == "decode":
            self._prefetch_expected(0)

    def expect(self, per_layer: dict | None) -> None:
        # the device path decides on the device without the host table: hints are not taken there
        self.expected.expect(None if self._want_device else per_layer)

    def forward(self, layer, hidden, topk_ids, topk_weights):
        t0 = time.perf_counter()
        self.ensure_sized()
        T, K = topk_ids.shape
        if self.phase == "decode" and self._device_decides(T * K):
            out = self._forward_device(layer, hidden, topk_ids, topk_weights)
            dt = time.perf_counter() - t0
            self._step_s += dt
            self.stats_.add(layer, calls=1, routed=T * K, wall_s=dt)
            return out.to(hidden.dtype)
        self._host_decides()
        self._harvest()
        local = topk_ids.to("cpu", torch.int64).numpy()
        if self.phase == "prefill":
            self.cache.table.learn_prompt(layer, local)     # "+prefetch": the predictor learns
        flat = local + layer * self.E
        out = None
        if self.phase == "prefill" and self.streamer is not None and self.streamer.worth_it(T, K, remember=True):
            out = self.streamer.forward(layer, hidden, flat, topk_weights, self._device_run, self.stats_)
        if out is None:
            out = self._forward_planned(layer, hidden, flat, topk_weights)
        dt = time.perf_counter() - t0
        self._step_s += dt
        self.stats_.add(layer, calls=1, routed=T * K, wall_s=dt)
        return out.to(hidden.dtype)

    def stats(self) -> dict:
        self._host_decides()
        c = self.cache
        return self.stats_.as_dict(spec_lookahead=self.expected.stats(), cache={"slots": c.capacity, "resident": c.resident, "evictions": c.evictions,
                                          "expert_nbytes": self.S, "gib": c.capacity * self.S / 2**30,
                                          **c.table.describe()},
                                   bandwidth=self.est.snapshot(), policy=self.planner.policy,
                                   guard=None if self.guard is None else {
                                       "winner": self.guard.winner, "switches": self.guard.switches,
                                       "fill_steps": self.guard.fill_steps})

    def resize_cache(self, slots: int) -> None:
        """Elastic memory: rebuild the cache with `slots` slots at a safe point (between steps)."""
        self._host_decides()
        if self.streamer is not None:
            self.streamer.release_all()
        self.cache.resize(slots)

    def cache_size(self) -> dict:
        self.ensure_sized()
        c = self.cache
        return {"bytes": c.capacity * self.S, "slots": c.capacity, "resident": c.resident, "device": str(self.device)}

    def resize_cache_bytes(self, nbytes: int) -> dict:
        self.ensure_sized()
        before = self.cache.capacity
        slots = slots_in(nbytes, self.S, self.pool.num_layers * self.pool.num_experts)
        if slots != before:
            self.resize_cache(slots)
            if self.device.type == "cuda":      # the freed banks back to the device for others
                torch.cuda.empty_cache()
        return {"before": before * self.S, "after": slots * self.S, "slots_before": before, "slots_after": slots}

    def pinned_bytes(self) -> int:
        return self.pool.pinned_bytes

    def close(self) -> None:
        self._host_decides()
        if self.streamer is not None:
            self.streamer.release_all()
        self.cache.drain()
        self.cpu.close()
        self.cache.copy.close()
        getattr(self.cpu.executor, "close", lambda: None)()

    # ---- decode decisions on the device ----------------------------------------------------
    def _device_decides(self, pairs: int) -> bool:
        return (self._want_device and self.planner.policy in ("offload", "hybrid")
                and applies(self.cache.table, self.planner, self.spec) and self.cache.capacity >= pairs + 1)

    def _forward_device(self, layer, hidden, topk_ids, weights):
        if self._devpath is None or self._devpath.lru.capacity != self.cache.capacity:
            self._devpath = DeviceDecisions(self.cache, self.planner, self.pool.num_layers)
        if self.streamer is not None:
            self.streamer.release_all()
        dp = self._devpath
        dp.take()
        policy = self._decode_policy or self.planner.policy
        out, cpu_s, n_cpu = dp.forward(layer, hidden, topk_ids, weights, policy, self.est.b_p, self.est.b_h, self.cpu)
        if n_cpu:
            self.est.observe_cpu(n_cpu * int(self.pool.layer_expert_nbytes[layer]), cpu_s)
            self.stats_.add(layer, cpu_s=cpu_s)
        return out

    def _host_decides(self) -> None:
        """The host table becomes the truth again; the device counters join the statistics."""
        if self._devpath is None or not self._devpath.active:
            return
        per_layer, st = self.pool.layer_expert_nbytes, self.stats_
        counts, per_expert = self._devpath.give_back()
        for key, c in zip(("hits", "fills", "cpu_experts"), per_expert):
            st.add_expert_counts(key, c)
        for layer, (hits, misses, fills, cpu) in enumerate(counts):
            S = int(per_layer[layer])       # this layer's expert bytes (a grouped pool's vary)
            st.add(layer, hits=hits, misses=misses, fills=fills, cpu_experts=cpu, bytes_copied=fills * S,
                   cpu_bytes=cpu * S)
            st.q_sum += fills
            st.m_sum += misses

    # ---- one layer ----------------------------------------------------------------------
    def _device_run(self, slot_ids: np.ndarray, hidden, weights, out) -> None:
        ids = torch.from_numpy(slot_ids).to(self.device, non_blocking=True)
        if self._ggml_types is not None and self.run_device is run_experts and ids.numel() <= SYNC_FREE_PAIRS:
            # ggml slots: gathered and dequantized by the types they carry, without a host sync
            # per expert (run_experts reads each expert's types on the host)
            run_slots(self.cache.banks, self.spec, ids, hidden, weights, out, types=self._ggml_types)
            return
        self.run_device(self.cache.banks, self.spec, ids, hidden, weights, out=out)

    def _forward_planned(self, layer, hidden, flat, weights):
        cache, S = self.cache, int(self.pool.layer_expert_nbytes[layer])    # this layer's real bytes
        uniq, inv, counts = np.unique(flat, return_inverse=True, return_counts=True)
        inv = inv.reshape(flat.shape)
        decode = self.phase != "prefill"
        policy = (self._decode_policy if decode else self._prefill_policy())
        if (policy or self.planner.policy) == "offload" and cache.table.pending.any():
            self._land_background()
        link_busy = cache.link_busy()
        d = decide(cache.table, self.planner, uniq, counts,
                   lambda misses, tokens, _room: self.planner.plan(misses, tokens, self.est.b_p, self.est.b_h,
                                                                    link_busy=link_busy, policy=policy),
                   admit=decode and (policy or self.planner.policy) == "hybrid")
        cpu_ids = d.cpu_ids

        # The CPU branch starts first, on its worker thread, so it runs while this thread copies
        # and computes the device branch (the device executor may block this thread: on a
        # host-memory device it computes here; torch_exec syncs to read expert ids).
        fut = None
        if len(cpu_ids):
            on_cpu = np.zeros(len(uniq), bool)
            on_cpu[np.searchsorted(uniq, cpu_ids)] = True
            fut = self.cpu.submit(hidden.to("cpu"), np.where(on_cpu[inv], flat, -1), weights.to("cpu"))
        if len(d.warm):
            cache.install(d.warm, d.warm_slots, background=True)

        # one row per (token, choice), summed over the choices at the end in a fixed order: the
        # output is bit-identical however the experts split into hits and fill waves (so a
        # cache of any size, resized at any time, gives the same numbers)
        per_choice = torch.zeros(*flat.shape, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        slot_u = np.full(len(uniq), -1, np.int64)
        t_fill = time.perf_counter()
        waves = d.waves()
        wave = next(waves, None)
        job = cache.install(*wave) if wave is not None else None
        t_dev = time.perf_counter()
        if d.hits:
            slot_u[d.hit] = d.hit_slots
            self.stats_.add_experts("hits", uniq[d.hit])
            self._device_run(slot_u[inv], hidden, weights, per_choice)
        dev_s = hits_s = time.perf_counter() - t_dev
        n_filled = 0
        while wave is not None:
            ids, wave_slots = wave
            cache.ready(job, wave_slots)                    # waits for the link (host tier)
            t_w = time.perf_counter()
            slot_u[:] = -1
            slot_u[np.searchsorted(uniq, ids)] = wave_slots
            self._device_run(slot_u[inv], hidden, weights, per_choice)
            cache.unlock(wave_slots)
            wave_dev = time.perf_counter() - t_w
            dev_s += wave_dev
            self._fill_jobs.append((job, wave_dev if self._host_device else 0.0))
            n_filled += len(ids)
            self.stats_.add_experts("fills", ids)
            wave = next(waves, None)
            if wave is not None:
                job = cache.install(*wave)
        d.release()
        fill_s = time.perf_counter() - t_fill - hits_s if n_filled else 0.0
        out = per_choice.sum(1)

        cpu_s = 0.0
        if fut is not None:
            cpu_out, cpu_s = fut.result()
            out.add_(cpu_out.to(out.device))
            self.est.observe_cpu(len(cpu_ids) * S, cpu_s)
        self._harvest()
        prefetched = self._prefetch(layer, uniq) if decode else np.empty(0, np.int64)

        st = self.stats_
        st.add_experts("cpu_experts", cpu_ids)
        moved = n_filled * S + self.pool.flat_nbytes(d.warm) + self.pool.flat_nbytes(prefetched)
        st.add(layer, hits=d.hits, misses=d.misses, fills=n_filled, prefetches=len(prefetched),
               warm_fills=len(d.warm), cpu_experts=len(cpu_ids), bytes_copied=moved,
               cpu_bytes=len(cpu_ids) * S, cpu_s=cpu_s, device_s=dev_s, fill_s=fill_s)
        if decode:
            st.q_sum += n_filled
            st.m_sum += d.plan.m
        return out

    def _prefetch(self, layer: int, uniq: np.ndarray) -> np.ndarray:
        """"+prefetch": copy the cache's guesses for the next layer in the background (they
        land before that layer runs when the link keeps up; until then they run on the CPU);
        then the experts expected there (speculative drafts), after counting this layer's."""
        self.expected.settle(layer, uniq - layer * self.E)
        ids, slots = self.cache.table.prefetch_after(uniq)
        if len(ids):
            self.cache.install(ids, slots, background=True)
        return np.concatenate([ids, self._prefetch_expected(layer + 1)])

    def _prefetch_expected(self, layer: int) -> np.ndarray:
        """Background copies of the experts expected at `layer` that are not resident (flat ids)."""
        ids = self.expected.take(layer)
        if not len(ids) or layer >= self.pool.num_layers:
            return np.empty(0, np.int64)
        t = self.cache.table
        want = ids + layer * self.E
        want = want[t.slot_of[want] < 0]
        slots = t.candidates(len(want), want) if len(want) else want
        want = want[:len(slots)]
        if len(want):
            self.cache.install(want, slots, background=True)
        self.expected.started_for(layer, want - layer * self.E)
        return want

    def _prefill_policy(self) -> str:
        # Prefill on demand (the cache cannot free two layers, or few tokens): the device does
        # the token-heavy work, so every miss fills unless this backend never fills.
        return self.planner.policy if self.planner.policy in ("cpu", "pageable") else "offload"

    def _land_background(self) -> None:
        """`offload` runs every expert on the device: background copies still in flight (the
        prefetches) land before a layer call decides, so a routed one is a hit, not a CPU run, and
        a wrong one's slot is a victim again, not a pending slot that leaves a miss nowhere to go
        (the link is one queue: a miss's fill would wait behind them anyway). The simulator lands
        prefetches in time the same way."""
        self.cache.wait_all()
        self._harvest()

    def _harvest(self) -> None:
        for job in self.cache.poll():
            self.est.observe_fill(job.nbytes, job.seconds)
        still = []
        for job, extra in self._fill_jobs:
            if job.done():
                self.est.observe_fill(job.nbytes, (job.seconds or 0.0) + extra)
            else:
                still.append((job, extra))
        self._fill_jobs = still


class CpuExperts(Experts):
    """`cpu`: every routed expert runs on the CPU from the host pool (also the path when the
    pool cannot be pinned); only activations cross to and from the device."""

    def __init__(self, pool: ExpertPool, device: torch.device, host_executor=None):
        self.pool, self.E, self.device = pool, pool.num_experts, torch.device(device)
        self.host = host_executor or make_host_executor(pool)
        self.stats_ = ExpertStats(pool.num_layers, "cpu", num_experts=pool.num_experts)
        self._expert_bytes = [int(b) for b in pool.layer_expert_nbytes]
        self._route_buf: dict[int, tuple[torch.Tensor, ...]] = {}
        self._row_counts = RowCounts(self.stats_, self._expert_bytes)     # (decode_row's calls: taken when read)

    def begin_step(self, phase: str, tokens: int | None = None) -> None:
        self.stats_.step(phase)

    def decode_row(self, layer: int, top_k: int, norm: bool, after: bool, x: torch.Tensor, logits: torch.Tensor,
                   residual: torch.Tensor, fresh: bool) -> MoERow | None:
        """`forward_logits(layer, x, logits, ..., residual=residual)` of one row as a `MoERow`
        on the caller's reused rows (x, logits, residual: contiguous fp32 [1, H], [1, E], [1, H]),
        its executor, offset and scratch resolved now; None where `forward_logits` would not take
        the one C call (a device engine, the torch executor)."""
        if self.device.type != "cpu" or not 0 < top_k <= 64:
            return None
        ex, offset = self.host.layer_executor(layer) if hasattr(self.host, "layer_executor") else (self.host, layer * self.E)
        if getattr(ex, "lib", None) is None or not hasattr(ex, "decode_row_args"):
            return None
        per_expert = self.stats_.pe["cpu_experts"][layer] if self.stats_.pe else None
        return MoERow(self, layer, ex, offset, top_k, norm, after, x, logits, residual, fresh, self._row_counts,
                      per_expert)

    def forward(self, layer, hidden, topk_ids, topk_weights):
        t0 = time.perf_counter()
        on_host = self.device.type == "cpu"      # the pure-CPU engine: skip the no-op transfers
        routed = topk_ids.numel()
        if on_host and 0 < routed <= 64 and hasattr(self.host, "run_layer"):
            out, ran = self.host.run_layer(layer, hidden, topk_ids, topk_weights)   # a decode call: no flat-id tensors
        else:
            ids = (topk_ids if on_host else topk_ids.to("cpu")).long() + layer * self.E
            out = self.host.run(hidden if on_host else hidden.to("cpu"), ids,
                                topk_weights if on_host else topk_weights.to("cpu"))
            # the distinct experts run, by id (the heat map): a decode step's few ids as a Python
            # set (~1 us), a prefill's many by a bincount (cheaper than a sort)
            if routed <= 64:
                ran = sorted(set(ids.reshape(-1).tolist()))
            else:
                ran = layer * self.E + np.flatnonzero(np.bincount(ids.reshape(-1).numpy() - layer * self.E,
                                                                  minlength=self.E))
        n = len(ran)
        self.stats_.add_experts("cpu_experts", ran)
        self.stats_.add_cpu_call(layer, routed, n, self._expert_bytes[layer], time.perf_counter() - t0)
        return out if on_host and out.dtype == hidden.dtype else out.to(hidden.device, hidden.dtype)

    def forward_logits(self, layer, hidden, logits, top_k: int, norm: bool, after: bool, routes=None, residual=None):
        """`forward` of the top-k of router `logits` (SparseMoE's softmax top-k rule) in one C
        call (`CpuExpertExecutor.decode`) for a decode step on the pure-CPU engine; None where
        that path does not apply (the caller routes and calls `forward`). `routes`: (ids int64,
        weights fp32), contiguous [T, top_k], to receive the routing (else scratch is used).
        `residual` (contiguous fp32 [T, H], hidden fp32): `residual + forward` in the same call."""
        T = hidden.shape[0]
        if self.device.type != "cpu" or not 0 < T * top_k <= 64 or logits.dtype != torch.float32:
            return None
        t0 = time.perf_counter()
        ex, offset = self.host.layer_executor(layer) if hasattr(self.host, "layer_executor") else (self.host, layer * self.E)
        if getattr(ex, "lib", None) is None or not hasattr(ex, "decode"):
            return None
        buf = self._route_buf.get(T * top_k)
        if buf is None:    # ids, flat ids and weights scratch, one per size (no allocation a step)
            buf = self._route_buf[T * top_k] = (torch.empty(T * top_k, dtype=torch.int64),
                                                torch.empty(T * top_k, dtype=torch.int64),
                                                torch.empty(T * top_k, dtype=torch.float32))
        ids, flat, w = buf if routes is None else (routes[0], buf[1], routes[1])
        if residual is not None and hidden.dtype is not torch.float32:
            return None
        out = ex.decode(hidden, logits.contiguous(), top_k, norm, after, offset, ids, flat, w, residual)
        base = layer * self.E
        ran = sorted({base + i for i in (ids if ids.dim() == 1 else ids.view(-1)).tolist()})   # (a view: ~20 us cold)
        self.stats_.add_experts("cpu_experts", ran)
        self.stats_.add_cpu_call(layer, T * top_k, len(ran), self._expert_bytes[layer], time.perf_counter() - t0)
        return out if out.dtype == hidden.dtype else out.to(hidden.dtype)

    def stats(self) -> dict:
        self._row_counts.flush()
        return self.stats_.as_dict()

    def close(self) -> None:
        getattr(self.host, "close", lambda: None)()
