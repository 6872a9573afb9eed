"""The verify cost curve of this machine and model, measured: forwards of 1, 2, 3, 5, 9, 17
positions (a pending token and 0..16 drafts) timed on a scratch sequence the first time a model
is served here, cached on disk like the kernel calibrations (kernels/choices.py). The price
(spec/price.py) takes the steps as its prior shape: a step size the run has not verified yet is
priced from what it measured here, not by the line through the short verifies (after the dense
replay's free-running windows the line priced 8 / 16 drafts at 0.68 / 0.44 of their measured
cost, docs/benchmarks.md).

The scratch sequence takes its KV blocks from the pool and gives them back; it never enters the
scheduler or the prefix cache, so nothing of it is left behind. A backend that keeps an expert
cache (`keeps_expert_cache`: the disk tier's host cache, an offload or hybrid device cache) is not
probed: a probe's random tokens route to experts no session asked for and would fill that cache
with them (on the disk tier each a read, the step's time those reads); its verifies are priced by
the union of experts as before (spec/price.py's online fit). It runs at start (a request
waiting on it would wait as long, and it needs the engine idle: its forwards run outside the
scheduler)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import torch

from ..kernels import cache_dir, sources_digest
from ..platform import cpu_flags, cpu_model
from ..sampling_params import SamplingParams
from .sequence import Sequence

log = logging.getLogger(__name__)

SIZES = (1, 2, 3, 5, 9, 17)       # positions a forward: a pending token and 0, 1, 2, 4, 8, 16 drafts
CONTEXT = 512                     # the scratch prompt: verify rows attend a context as a session's do
ROUNDS = 5                        # timed rounds (each size once a round, the order reversed every other)
WARMUP = 1                        # rounds run first and dropped (first calls, cold caches)
FORMAT = 1                        # the cache entry's layout; another is measured again
MAX_AGE_S = 30 * 86400            # a curve older than this is measured again
QUIET_LOAD = 0.5                  # load per core under which a curve counts as measured quiet


def sizes_for(max_draft: int) -> tuple[int, ...]:
    """The probe's step sizes up to a verify of max_draft drafts (which is always one of them)."""
    return tuple(sorted({n for n in SIZES if n <= max_draft + 1} | {max_draft + 1}))


def _load_per_core() -> float | None:
    try:
        return os.getloadavg()[0] / len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def measure(runner, blocks, vocab: int, sizes, max_len: int, observer=None, context: int = CONTEXT,
            rounds: int = ROUNDS, warmup: int = WARMUP, seed: int = 0,
            clock=time.perf_counter) -> list[tuple[int, int, float]] | None:
    """(positions, distinct experts, seconds) of the timed forwards: a scratch prompt of up to
    `context` random tokens, then rounds of one forward a size at the position after it (a
    pending token and size - 1 random drafts, rejected as a verify's would be), each between two
    1-position forwards. A size's seconds are its ratio to those two neighbours times the median
    1-position step: other programs' load moves from round to round (on 2 cores shared with a
    test run, 5 rounds of plain seconds read 2 positions 1.40x and 3 positions 1.05x a plain
    step), rarely within three forwards. Rounds go on (up to 2x `rounds`) while a size's ratios
    still spread more than 4% about their median. None where the model's length or the KV
    pool's free blocks leave no room. Its blocks go back to the pool at the end, raising or not."""
    g = torch.Generator().manual_seed(seed)
    context = min(context, max_len - max(sizes) - 1)
    need = context + max(sizes) + 1
    if context < 1 or need > blocks.block_size * blocks.num_free:
        return None
    seq = Sequence("\x00verify-probe", torch.randint(0, vocab, (context,), generator=g).tolist(),
                   SamplingParams(max_tokens=2, temperature=0.0), None, seed)
    cuda = str(getattr(runner, "device", "cpu")).startswith("cuda")
    ones, rel = [], {n: [] for n in sizes if n > 1}
    try:
        blocks.allocate(seq, need)
        runner.run([(seq, context)])
        seq.num_computed = context
        seq.append(0)
        # every step at the same position: the pending token's row is written again, a state
        # (recurrent, window) put back as a rejected verify's is
        stateful = seq.state is not None and bool(getattr(seq.state, "parts", None))
        snap = seq.state.snapshot() if stateful else None

        def step(n):
            seq.output_ids[-1] = int(torch.randint(0, vocab, (1,), generator=g))
            seq.draft = torch.randint(0, vocab, (n - 1,), generator=g).tolist()
            if observer is not None:
                observer.start()
            t0 = clock()
            runner.run([(seq, n)])
            if cuda:
                torch.cuda.synchronize()
            dt = clock() - t0
            if snap is not None:
                seq.state.restore(snap)
            return observer.unique if observer is not None else 0, dt

        r = 0
        while r < warmup + rounds or (r < warmup + 2 * rounds and _spread(rel) > 0.04):
            order = [n for n in sizes if n > 1]
            u0, t0 = step(1)
            for n in (order if r % 2 == 0 else order[::-1]):
                u, t = step(n)
                u1, t1 = step(1)
                if r >= warmup:
                    rel[n].append((u, t / (0.5 * (t0 + t1))))
                    ones.append((u0, t0))
                u0, t0 = u1, t1
            r += 1
    finally:
        seq.draft, seq.state = [], None
        blocks.release(seq)
        runner.idle()
    level = sorted(t for _, t in ones)[len(ones) // 2]
    return [(1, u, t) for u, t in ones] + [(n, u, x * level) for n, got in rel.items() for u, x in got]


def _spread(rel: dict) -> float:
    """The largest median absolute deviation of a size's ratios over their median (1 before 3 of each)."""
    worst = 0.0
    for got in rel.values():
        x = sorted(v for _, v in got)
        if len(x) < 3:
            return 1.0
        m = x[len(x) // 2]
        worst = max(worst, sorted(abs(v - m) for v in x)[len(x) // 2] / m)
    return worst


def clock_for(settings):
    """The thread's CPU clock for an engine of one CPU thread (every forward computes on the
    calling thread: the seconds it computed, not those it waited for a core; on 2 cores at load
    4-5 the wall clock read 17 positions 2.65-3.00x a plain step, 9 positions 1.41-1.55x, the
    thread's clock 2.84-2.85x and 1.62-1.65x, quiet 3.03x and 1.76x), else the wall clock."""
    return time.thread_time if settings.device.type == "cpu" and settings.num_threads == 1 else time.perf_counter


def _key(engine, sizes) -> str:
    """Machine (CPU model and flags, the kernels' sources, torch), model shape (its config),
    device, tier and the options that pick kernels: a curve is another machine's or model's
    when any of them differs."""
    s, c, m = engine.settings, engine.cfg, engine.model
    shape = getattr(getattr(m, "hf", None), "data", None) or {"class": type(m).__name__, "layers": m.num_layers}
    parts = {"cpu": cpu_model(), "flags": sorted(cpu_flags()), "kernels": sources_digest(),
             "torch": torch.__version__, "model": shape, "device": str(s.device), "dtype": str(s.dtype),
             "compute": str(s.compute_dtype), "threads": s.num_threads, "moe": s.moe_backend,
             "tier": s.expert_tier, "expert_slots": s.expert_cache_slots,
             "options": [c.kernel_isa, c.prefill_gemm, c.bf16_dot, c.decode_gemv, c.decode_attention],
             "sizes": list(sizes), "context": CONTEXT, "rounds": ROUNDS, "format": FORMAT}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_entry(path) -> list[tuple[int, int, float]] | None:
    """The cached steps, or None where the file is missing, unreadable, of another format, too
    old, or measured under load while the machine is now quieter (measured again then)."""
    try:
        with open(path) as f:
            e = json.load(f)
        if e["format"] != FORMAT or time.time() - float(e["measured_at"]) > MAX_AGE_S:
            return None
        steps = [(int(n), int(u), float(t)) for n, u, t in e["steps"]]
        load, now = e.get("load"), _load_per_core()
        if load is not None and now is not None and load > QUIET_LOAD and now < load / 2:
            return None
        if not steps or any(n < 1 or not t > 0 for n, _, t in steps):
            return None
        return steps
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_entry(path, steps, load: float | None) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"format": FORMAT, "measured_at": time.time(), "load": load, "steps": steps}, f)
        os.replace(tmp, path)
    except OSError:
        pass


def verify_curve(engine, cache=None) -> tuple[list[tuple[int, int, float]] | None, str]:
    """(the probe's steps for this engine, where they came from: "cached", "measured", or why
    there are none), measured and cached on a miss. `cache`: the folder (default: the kernels')."""
    experts = engine.model.experts
    if experts is not None and experts.keeps_expert_cache:
        return None, "the experts backend keeps a cache the probe would fill (priced online by the union of experts)"
    spec = engine.spec
    sizes = sizes_for(spec.K)
    path = os.path.join(cache if cache is not None else cache_dir(), f"verify-curve-{_key(engine, sizes)}.json")
    steps = read_entry(path)
    if steps is not None:
        return steps, "cached"
    load = _load_per_core()
    steps = measure(engine.runner, engine.blocks, engine.vocab_size, sizes, engine.max_model_len, spec.observer,
                    clock=clock_for(engine.settings))
    if steps is None:
        return None, "no room in the KV pool"
    write_entry(path, steps, load)
    return steps, "measured"
