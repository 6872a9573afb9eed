"""The automatic choices that depend on the machine, made once at start and logged once.

Activations: on the CPU with the compiled kernels they are float32 whatever the checkpoint's
dtype, because every decode-path kernel (dense GEMV, routed experts, attention, norms, rope)
reads bf16 weights and KV in place but takes fp32 inputs; bf16 activations sent decode through
torch's bf16 ops and SDPA instead (measured on a Zen 4 with AVX512-BF16, medium bf16
Qwen3-MoE, 2 threads: decode 0.47x llama.cpp at a 512-token context and 0.14x at 4096, against
0.97x and 0.81x with float32 activations).

Prefill GEMMs are compute bound: with native bf16 instructions (AVX512-BF16, AMX) torch's bf16
GEMM over the bf16 weight can beat dequantize + fp32 GEMM several times, or lose (oneDNN picks
its paths per CPU), so a short calibration decides; its result is cached next to the kernels,
keyed by the CPU flags, torch's version and the thread count. Without native bf16 no
calibration runs: fp32 is 2x faster there (see platform.cpu_has_fast_bf16).

bf16 weights in the kernels' dot products: with AVX512-BF16, vdpbf16ps multiplies bf16 weights by
activations rounded to bf16 (llama.cpp's way), 32 pairs per instruction instead of widening the
weights to fp32 for FMAs. A single-token GEMV from DRAM is memory bound either way; with several
tokens per weight row (concurrent streams, prefill) it measured 1.2-1.5x faster on a Sapphire
Rapids core. The same switch rounds the queries and the softmax numerators of decode attention
over a bf16 KV cache to bf16 (vdpbf16ps on the cache rows in place, as llama.cpp computes on its
cache). Switched on under "auto" where the CPU has it and a short calibration of the decode
step's shape (a GEMV streamed from DRAM plus attention over 4096 keys, at 1 row and at a
verify's 5 and 9) says a mix of plain and verify steps is faster and a plain step no slower,
cached per CPU model like the GEMM choice; an explicit compute_dtype keeps fp32 activations exact.

The decode GEMV over bf16 weights on AMX tiles (kernels/c/amx_gemv.c: activations rounded to
bf16, 16 weight rows per tile product with up to 16 tokens each): a decode step of one row is
memory bound either way, but the dot tiles turn compute bound beyond one row (a verify of k
drafts, concurrent streams), the tiles stay memory bound up to ~65 rows. Switched on under
"auto" where the CPU has AMX-BF16, the OS grants the tile state and a short calibration (1, 4
and 16 rows of a GEMV streamed from DRAM, against the dot tiles the bf16-dot choice runs) says
it is faster in sum, cached like the others; every row count of a GEMV call takes the same path, so a
verify step stays batch invariant."""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import InvalidRequestError
from ..platform import NATIVE_BF16, cpu_flags, cpu_model
from ..progress import progress
from ..quant.ggml_act import act_mode
from . import cache_dir, cpu_kernels, sources_digest, variants_here
from .gemm import EXPERT_MIN_TOKENS, GEMM_MODES, GGML_GROUP_MIN, gemm_bf16, mode_code, modes_here, set_tiles_rounding
from .ggml_k256 import measure_k256
from .int8_tiles import measure_int8_tiles
from .interleaved import Timings, steady_seconds, timed_interleaved
from .pool import CpuPool, shared_pool
from .switch_set import require_loading

log = logging.getLogger(__name__)

BF16_DOT = frozenset({"avx512_bf16"})         # vdpbf16ps, the instruction of the bf16 dot tiles
AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl"})
AVX2 = frozenset({"avx2", "fma", "f16c"})
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def isa_level(flags: frozenset[str]) -> str:
    """The widest kernel path this CPU runs: "avx512" (F/BW/VL), "avx2" (with FMA, F16C) or "portable"."""
    if AVX512 <= flags:
        return "avx512"
    if AVX2 <= flags:
        return "avx2"
    return "portable"


def activation_dtype(weights: torch.dtype, device: torch.device, requested: str, *,
                     kernels: bool, flags: frozenset[str]) -> torch.dtype:
    """Dtype of the activations (dense weights keep their storage dtype, see layers/linear.py)."""
    if requested != "auto":
        return _DTYPES[requested]
    if device.type != "cpu" or weights not in (torch.bfloat16, torch.float16):
        return weights
    if kernels:             # the kernels compute in fp32 from bf16 weights/KV read in place
        return torch.float32
    # torch path only: its bf16 matmuls beat fp32 only with native instructions
    return weights if flags & NATIVE_BF16 else torch.float32


def measure_gemm(threads: int, m: int = 256, n: int = 2048, k: int = 2048, reps: int = 3,
                 expert: tuple[int, int, int] = (64, 1536, 2048)) -> dict:
    """Seconds per prefill-shaped GEMM over a bf16 weight: dequantize + fp32 GEMM ("fp32"),
    torch's native bf16 GEMM ("bf16"), our tiles ("amx", "vdpbf16ps" where they run natively),
    the conversions each needs included; and on an expert-sized GEMM (`expert`: tokens of one
    expert, its gate+up rows, hidden) the expert kernel's dot products ("dots_expert") against
    the tiles ("<mode>_expert"); interleaved rounds (kernels/interleaved.py). About a second in all."""
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    lib = cpu_kernels()
    pool = CpuPool(lib, threads) if lib is not None else None
    if lib is not None:
        lib.ft_set_gemv_amx(0)      # "dots_expert" is the dot tiles (model_kernels sets the choice after)
    try:
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g).bfloat16()
        w32 = torch.empty(n, k)

        def fp32():
            w32.copy_(w)
            return torch.nn.functional.linear(x, w32)

        def bf16():
            return torch.nn.functional.linear(x.bfloat16(), w).float()

        ways = {"fp32": fp32, "bf16": bf16}
        tiles = [t for t in modes_here(lib) if t != "plain"] if lib is not None else []
        for mode in tiles:
            ways[mode] = functools.partial(gemm_bf16, pool, GEMM_MODES[mode], w, x)
        if tiles:
            em, en, ek = expert
            xe, we = torch.randn(em, ek, generator=g), torch.randn(en, ek, generator=g).bfloat16()
            ye = torch.empty(em, en)

            def dots():
                lib.ft_linear_run(pool.handle, 1, we.data_ptr(), 2 * ek, None, 0, en, ek, xe.data_ptr(), 0, em,
                                  None, ye.data_ptr())
            ways["dots_expert"] = dots
            for mode in tiles:
                ways[f"{mode}_expert"] = functools.partial(gemm_bf16, pool, GEMM_MODES[mode], we, xe, out=ye)
        now = {}
        return timed_interleaved(lambda: now["way"](), lambda name: now.update(way=ways[name]), tuple(ways), reps)
    finally:
        if pool is not None:
            pool.close()
        torch.set_num_threads(prev)


RETRIES = 3     # starts that measure a calibration too close to call before its default sticks
# in the entries' key: a tree from before the rounds (issue 38) sharing the cache keeps its own files
ENTRY_FORMAT = b"rounds1"
QUIET_LOAD = 0.5    # load average per core under which a calibration counts as measured quiet


def _load_per_core() -> float | None:
    """The 1-minute load average per core this process may run on (None where the OS has none)."""
    try:
        return os.getloadavg()[0] / len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _quieter_now(measured_at: float | None) -> bool:
    """Whether a calibration measured at `measured_at` load per core is worth measuring again now:
    it was not quiet, and the machine is now under half that load (a first start during a
    compile or a download is measured again at a later, quieter start; each time at least
    halving the load, so a few times at most)."""
    now = _load_per_core()
    return measured_at is not None and now is not None and measured_at > QUIET_LOAD and now < measured_at / 2


def _entry(path: str | None) -> tuple[Timings, int, float | None] | None:
    """(the rounds, the starts that measured them, the load per core then) of a cache entry; None
    where there is none or it is not one (an entry of the earlier format, each variant's best
    wall time, is measured again: under load it could have flipped)."""
    if path is None:
        return None
    try:
        with open(path) as f:
            e = json.load(f)
        load = e.get("load")
        return (Timings([{k: float(v) for k, v in r.items()} for r in e["rounds"]]), int(e["tries"]),
                None if load is None else float(load))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _decided(t: Timings, pick: Callable[[dict], object], default: object) -> object:
    """pick(t) where the odd and the even rounds alone pick the same. Where they differ the margin
    is within this measurement's noise: the default is kept if it is among their picks (t.sure
    False: a later start measures again), else every half beats it and t's pick stands."""
    whole = pick(t)
    picks = {pick(steady_seconds(h)) for h in (t.rounds[0::2], t.rounds[1::2]) if h} | {whole}
    t.sure = len(picks) == 1 or default not in picks
    return whole if t.sure else default


def _measured(what: str, measure: Callable[[], dict], pick: Callable[[dict], object], default: object) -> Timings:
    """measure()'s timings (an injected plain dict: one round), and as many rounds again where
    they are too close to call (`_decided`)."""
    with progress(1, f"calibrate {what.split(':')[0]} (once per machine, cached)", unit="steps") as bar:
        t = _as_timings(measure())
        _decided(t, pick, default)
        if not t.sure:
            t = Timings(t.rounds + _as_timings(measure()).rounds)
        bar.update(1)
    return t


def _as_timings(t: dict) -> Timings:
    return t if isinstance(t, Timings) else Timings([dict(t)])


def _calibrated(cache: os.PathLike | None, what: str, flags: frozenset[str], threads: int,
                measure: Callable[[], dict], pick: Callable[[dict], object], default: object) -> tuple[object, dict]:
    """(the choice, the timings that decided it: kernels/interleaved.py) of measure()'s rounds,
    cached in `cache` per calibration, CPU flags, torch version, thread count and kernel sources
    (a changed kernel can flip a choice), with the load it was measured at. Too close to call
    (`_decided`): `default`, and a later start measures again (RETRIES starts in all); measured
    under load, a later start at under half that load measures again (`_quieter_now`). An entry
    pick cannot read is measured again, uncached."""
    path = None
    if cache is not None:
        key = hashlib.sha256(ENTRY_FORMAT + what.encode() + " ".join(sorted(flags)).encode() + torch.__version__.encode()
                             + str(threads).encode() + sources_digest().encode()).hexdigest()[:16]
        path = os.path.join(cache, f"{what.split(':')[0]}-choice-{key}.json")
    got, tries, load = _entry(path) or (None, 0, None)
    if got is not None:
        try:
            choice = _decided(got, pick, default)
            if (got.sure or tries >= RETRIES) and not _quieter_now(load):
                return choice, got
        except (KeyError, TypeError, ValueError):
            path = None
    load = _load_per_core()
    t = _measured(what, measure, pick, default)
    choice = _decided(t, pick, default)
    if not t.sure:
        log.info("calibrate %s: too close to call (the halves of its rounds pick differently), the default kept; "
                 "measured again at a later start (%d of %d)", what.split(":")[0], tries + 1, RETRIES)
    if path is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"rounds": t.rounds, "tries": tries + 1, "load": load}, f)
            os.replace(tmp, path)
        except OSError:
            pass
    return choice, t


PREFILL_GEMMS = ("float32", "bfloat16", "amx", "vdpbf16ps")     # EngineConfig.prefill_gemm's forced values
_GEMM_KEYS = {"fp32": "float32", "bf16": "bfloat16", "amx": "amx", "vdpbf16ps": "vdpbf16ps"}


def prefill_gemm_choice(requested: str, activations: torch.dtype, *, kernels: bool, flags: frozenset[str],
                        threads: int, measure: Callable[[int], dict] = measure_gemm,
                        cache: os.PathLike | None = None, forced: str = "auto") -> tuple[str, str | None, dict | None]:
    """(the dense layers' prefill GEMM: float32 | bfloat16 | amx | vdpbf16ps, the routed experts'
    tiles: amx | vdpbf16ps | None for the dot products, the timings that decided or None).
    `forced` (EngineConfig.prefill_gemm) wins for both; else only "auto" on a CPU with the kernels
    and native bf16 is measured, and an explicit compute_dtype keeps every GEMM in that dtype."""
    if forced != "auto":
        return forced, forced if forced in ("amx", "vdpbf16ps") else None, None
    own = "float32" if activations == torch.float32 else "bfloat16"
    if requested != "auto" or not kernels or not flags & NATIVE_BF16:
        return own, None, None
    pick, t = _calibrated(cache, "gemm2:m256n2048k2048:e64n1536k2048", flags, threads, lambda: measure(threads),
                          _pick_gemm, (own, None))
    return pick + (t,)


def _pick_gemm(t: dict) -> tuple[str, str | None]:
    dense = _GEMM_KEYS[min((k for k in _GEMM_KEYS if k in t), key=lambda k: t[k])]
    tiles = [m for m in ("amx", "vdpbf16ps") if f"{m}_expert" in t]
    best = min(tiles, key=lambda m: t[f"{m}_expert"], default=None)
    expert = best if best is not None and t[f"{best}_expert"] < t["dots_expert"] else None
    return dense, expert


# The rows of the decode steps that the bf16-dot choice weighs, as fractions of the steps: with
# speculation a step runs 1 row (no draft) or a verify's k + 1 (here k = 4 and 8, short and long
# drafts alike), an assumed half of the steps each, as on agent output where the price drafts
# about every other step. One choice serves both kinds: greedy output needs every row's
# arithmetic the same whatever the step's row count, so a plain step and a verify run alike.
DOT_MIX = {1: 0.5, 5: 0.25, 9: 0.25}
DOT_PLAIN_MARGIN = 1.02     # the 1-row step may cost this much more: free-running output is all 1-row steps


def measure_bf16_dot(threads: int, n: int = 2048, k: int = 2048, tokens: tuple[int, ...] = tuple(DOT_MIX),
                     reps: int = 5, keys: int = 4096, out_of_cache: int = 64 << 20) -> dict:
    """Seconds of a decode step's shape at each of `tokens` rows with fp32 activations ("fp32-<rows>")
    and with the vdpbf16ps tiles ("bf16-<rows>"): the library's GEMV of the rows over a bf16 [n, k]
    weight read from DRAM (copies rotated past `out_of_cache` bytes, as a decode step streams its
    weights), plus decode attention of the rows (32 query heads over `keys` keys of 4 bf16 KV heads
    x 128; scores and values in bf16 under the switch); and "fp32" / "bf16", the DOT_MIX of them. A
    cache-resident GEMV is compute-bound and flatters vdpbf16ps (on a Zen 4 it said 2.2x where the
    1-row GEMV from DRAM is at par); a 1-row GEMV alone missed what a verify's rows cost (fp32 FMAs
    at their peak on a Zen 4). Under a second."""
    lib = cpu_kernels()
    pool = CpuPool(lib, threads)
    lib.ft_set_gemv_amx(0)          # the dot tiles both ways (model_kernels sets the choice after)
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(n, k, generator=g).bfloat16()
    ws = [w0] + [w0.clone() for _ in range(max(1, -(-out_of_cache // w0.nbytes)) - 1)]
    most, hq, hkv, d = max(tokens), 32, 4, 128
    xs = {m: torch.randn(m, k, generator=g) for m in tokens}
    y = torch.empty(most, n)
    kc, vc = (torch.randn(keys + most, hkv, d, generator=g).bfloat16() for _ in range(2))
    slots = torch.randperm(keys + most, generator=g).expand(most, keys + most).contiguous()
    lens, now = torch.arange(keys, keys + most), {"rows": 1}
    q, o = torch.randn(most, hq, d, generator=g), torch.empty(most, hq, d)

    def run():
        m = now["rows"]
        for w in ws:
            lib.ft_linear_run(pool.handle, 1, w.data_ptr(), 2 * k, None, 0, n, k, xs[m].data_ptr(), 0, m, None,
                              y.data_ptr())
        if keys:
            lib.ft_decode_attention(pool.handle, q.data_ptr(), m, hq, hkv, d, kc.data_ptr(), vc.data_ptr(), 1,
                                    slots.data_ptr(), keys + most, lens.data_ptr(), d ** -0.5, None, o.data_ptr())

    def switch(name):
        mode, rows = name.split("-")
        now["rows"] = int(rows)
        lib.ft_set_bf16_dot(int(mode == "bf16"))
    try:
        t = timed_interleaved(run, switch, tuple(f"{m}-{r}" for r in tokens for m in ("fp32", "bf16")), reps)
    finally:
        lib.ft_set_bf16_dot(0)
        pool.close()
    if set(tokens) != set(DOT_MIX):
        return t
    return Timings([dict(r, **{m: dot_mix_seconds(r, m) for m in ("fp32", "bf16")}) for r in t.rounds])


def dot_mix_seconds(t: dict, mode: str) -> float:
    """Seconds of a step of DOT_MIX's rows in `mode` ("fp32" | "bf16") from per-row timings."""
    return sum(f * t[f"{mode}-{rows}"] for rows, f in DOT_MIX.items())


def bf16_dot_faster(t: dict) -> bool:
    """vdpbf16ps where DOT_MIX's steps are faster with it and a 1-row step costs at most
    DOT_PLAIN_MARGIN more (the mix of a workload is not known at start: agent output verifies
    often, free-running output almost never)."""
    return (dot_mix_seconds(t, "bf16") < dot_mix_seconds(t, "fp32")
            and t["bf16-1"] <= DOT_PLAIN_MARGIN * t["fp32-1"])


def bf16_dot_choice(requested: str, weights: torch.dtype, *, kernels: bool, flags: frozenset[str], threads: int,
                    measure: Callable[[int], dict] = measure_bf16_dot,
                    cache: os.PathLike | None = None, forced: str = "auto") -> tuple[bool, dict | None]:
    """(whether bf16 weights run through vdpbf16ps with bf16-rounded activations, the timings).
    `forced` (EngineConfig.bf16_dot: on | off) wins; "on" without vdpbf16ps runs the kernels'
    emulation of the same arithmetic."""
    if forced != "auto":
        return forced == "on" and kernels and weights == torch.bfloat16, None
    if requested != "auto" or not kernels or weights != torch.bfloat16 or not BF16_DOT <= flags \
            or isa_level(flags) != "avx512":
        return False, None
    # keyed per CPU model: vCPUs with the same flags differ in it
    return _calibrated(cache, f"bf16dot2:dram-attn4096-r1-5-9:{cpu_model()}:{threads}", flags, threads,
                       lambda: measure(threads), bf16_dot_faster, False)


AMX_FLAGS = frozenset({"amx_bf16", "amx_tile"})


def measure_amx_gemv(threads: int, bf16_dot: bool = False, n: int = 2048, k: int = 2048,
                     tokens: tuple[int, ...] = (1, 4, 16), reps: int = 3, out_of_cache: int = 64 << 20) -> dict:
    """Seconds of decode GEMVs of `tokens` rows over a bf16 [n, k] weight streamed from DRAM
    (copies rotated past `out_of_cache` bytes) through the dot tiles ("dots", vdpbf16ps when
    `bf16_dot`) and the AMX tiles ("amx", only where the library runs them). Well under a second."""
    lib = cpu_kernels()
    pool = CpuPool(lib, threads)
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(n, k, generator=g).bfloat16()
    ws = [w0] + [w0.clone() for _ in range(max(1, -(-out_of_cache // w0.nbytes)) - 1)]
    xs = [torch.randn(m, k, generator=g) for m in tokens]
    ys = [torch.empty(m, n) for m in tokens]

    def run():
        for w in ws:
            for x, y in zip(xs, ys):
                lib.ft_linear_run(pool.handle, 1, w.data_ptr(), 2 * k, None, 0, n, k, x.data_ptr(), 0, x.shape[0],
                                  None, y.data_ptr())
    try:
        lib.ft_set_bf16_dot(int(bf16_dot))
        modes = ("dots", "amx") if lib.ft_set_gemv_amx(1) else ("dots",)
        return timed_interleaved(run, lambda name: lib.ft_set_gemv_amx(int(name == "amx")), modes, reps)
    finally:
        lib.ft_set_gemv_amx(0)
        lib.ft_set_bf16_dot(0)
        pool.close()


def amx_gemv_choice(requested: str, weights: torch.dtype, *, kernels: bool, flags: frozenset[str], threads: int,
                    bf16_dot: bool, measure: Callable[..., dict] = measure_amx_gemv,
                    cache: os.PathLike | None = None, forced: str = "auto") -> tuple[bool, dict | None]:
    """(whether the decode GEMV of bf16 weights runs on the AMX tiles, the timings). `forced`
    (EngineConfig.decode_gemv: amx | dots) wins (model_kernels refuses "amx" where AMX does not
    run); "auto" measures only with the kernels, bf16 weights, fp32 activations asked by "auto"
    and AMX-BF16 in the flags."""
    if forced != "auto":
        return forced == "amx" and kernels and weights == torch.bfloat16, None
    if requested != "auto" or not kernels or weights != torch.bfloat16 or not AMX_FLAGS <= flags:
        return False, None
    return _calibrated(cache, f"amxgemv:dram-m1-4-16:{cpu_model()}:{threads}:dot{int(bf16_dot)}", flags, threads,
                       lambda: measure(threads, bf16_dot), lambda t: "amx" in t and t["amx"] < t["dots"], False)


def measure_att_amx(threads: int, keys: int = 1536, rows: tuple[int, ...] = (1, 9), reps: int = 3,
                    out_of_cache: int = 64 << 20) -> dict:
    """Seconds of decode attention over a bf16 paged cache (32 query / 4 KV heads x 128, `keys`
    keys in random slots, copies rotated past `out_of_cache` bytes) for a plain step of one row
    and a verify of 9 rows ("fp32-1", "fp32-9"), and on the AMX tiles ("amx-1", "amx-9", only
    where the library runs them). Well under a second."""
    lib = cpu_kernels()
    pool = CpuPool(lib, threads)
    g = torch.Generator().manual_seed(0)
    hq, hkv, d, most = 32, 4, 128, max(rows)
    n = keys + most
    caches = [tuple(torch.randn(n, hkv, d, generator=g).bfloat16() for _ in range(2))
              for _ in range(max(1, -(-out_of_cache // (4 * n * hkv * d))))]
    slots = torch.randperm(n, generator=g).expand(most, n).contiguous()
    lens = torch.arange(keys, keys + most)
    q, o = torch.randn(most, hq, d, generator=g), torch.empty(most, hq, d)
    now = {"rows": 1}

    def run():
        for kc, vc in caches:
            lib.ft_decode_attention(pool.handle, q.data_ptr(), now["rows"], hq, hkv, d, kc.data_ptr(), vc.data_ptr(), 1,
                                    slots.data_ptr(), n, lens.data_ptr(), d ** -0.5, None, o.data_ptr())

    def switch(name):
        mode, r = name.split("-")
        now["rows"] = int(r)
        lib.ft_set_att_amx(int(mode == "amx"))
    try:
        modes = ("fp32", "amx") if lib.ft_set_att_amx(1) else ("fp32",)
        return timed_interleaved(run, switch, tuple(f"{m}-{r}" for r in rows for m in modes), reps)
    finally:
        lib.ft_set_att_amx(0)
        pool.close()


def att_amx_faster(t: dict) -> bool:
    """AMX attention where it runs, a verify of 9 rows is faster and a plain step of one row is
    no slower (within 2%: decoding must not lose what verifying wins)."""
    return "amx-1" in t and t["amx-9"] < t["fp32-9"] and t["amx-1"] <= 1.02 * t["fp32-1"]


def att_amx_choice(weights: torch.dtype, *, kernels: bool, flags: frozenset[str], threads: int,
                   measure: Callable[..., dict] | None = None, cache: os.PathLike | None = None,
                   forced: str = "auto") -> tuple[bool, dict | None]:
    """(whether decode attention over a bf16 KV cache runs its scores and values on AMX tiles, the
    timings). `forced` (EngineConfig.decode_attention: amx | fp32) wins (model_kernels refuses
    "amx" where AMX does not run); "auto" measures only with the kernels, a bf16 cache (bf16
    weights) and AMX-BF16 in the flags. Either way as accurate as fp32 (the queries and weights
    in three exact bf16 parts), not the same bits."""
    if forced != "auto":
        return forced == "amx" and kernels and weights == torch.bfloat16, None
    if not kernels or weights != torch.bfloat16 or not AMX_FLAGS <= flags:
        return False, None
    run = measure or measure_att_amx
    return _calibrated(cache, f"amxattn:dram-1536-r1-9:{cpu_model()}:{threads}", flags, threads,
                       lambda: run(threads), att_amx_faster, False)


PREFILL_ATT_MODES = {"torch": 0, "amx": 1, "vdpbf16ps": 2}   # ft_set_prefill_att's codes


def measure_prefill_att(threads: int, tokens: int = 1024, reps: int = 3) -> dict:
    """Seconds of one causal bf16 prompt's attention (32 query / 4 KV heads x 128, `tokens`
    tokens) through torch's CPU flash kernel ("torch", the heads repeated for it as
    layers/attention/prefill.py does), the library's kernel on AMX tiles ("amx") and with
    vdpbf16ps ("vdpbf16ps"), each only where the library runs it."""
    lib = cpu_kernels()
    pool = CpuPool(lib, threads)
    g = torch.Generator().manual_seed(0)
    hq, hkv, d = 32, 4, 128
    q, k, v = (torch.randn(1, h, tokens, d, generator=g).bfloat16() for h in (hq, hkv, hkv))
    out, now = torch.empty(1, hq, tokens, d), {}
    flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")   # as layers/attention/prefill.py

    def run():
        if now["name"] == "torch":
            flash(q, k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1), 0.0, True, scale=d ** -0.5)
            return
        lib.ft_prefill_attention(pool.handle, q.data_ptr(), q.stride(1), q.stride(2), tokens, hq, hkv, d, k.data_ptr(),
                                 k.stride(1), k.stride(2), v.data_ptr(), v.stride(1), v.stride(2), tokens, d ** -0.5,
                                 out.data_ptr(), out.stride(1), out.stride(2))
    try:
        names = ("torch",) + tuple(m for m in ("amx", "vdpbf16ps") if lib.ft_set_prefill_att(PREFILL_ATT_MODES[m]))
        return timed_interleaved(run, lambda name: (now.update(name=name),
                                                   lib.ft_set_prefill_att(PREFILL_ATT_MODES[name])), names, reps)
    finally:
        lib.ft_set_prefill_att(0)
        pool.close()


def prefill_att_choice(weights: torch.dtype, *, kernels: bool, flags: frozenset[str], threads: int,
                       measure: Callable[..., dict] | None = None, cache: os.PathLike | None = None,
                       forced: str = "auto") -> tuple[str, dict | None]:
    """(where causal bf16 prefill attention runs: "amx" | "vdpbf16ps" (kernels/c/prefill_attention.c
    on AMX tiles or with vdpbf16ps) | "torch" (its flash kernel), the timings). `forced`
    (EngineConfig.prefill_attention) wins (model_kernels refuses a kernel that does not run here);
    "auto" measures only with the kernels, bf16 weights (the prefill attention multiplies in bf16
    where the prefill GEMM does) and AMX-BF16 or AVX512-BF16 in the flags, and takes the fastest."""
    if forced != "auto":
        return (forced if kernels else "torch"), None
    if not kernels or weights != torch.bfloat16 or not (AMX_FLAGS <= flags or BF16_DOT <= flags):
        return "torch", None
    run = measure or measure_prefill_att
    return _calibrated(cache, f"prefattn2:1024-32-4:{cpu_model()}:{threads}", flags, threads,
                       lambda: run(threads), lambda t: min(t, key=t.get), "torch")


@dataclass(frozen=True)
class CpuChoices:
    isa: str                        # avx512 | avx2 | portable (the flags' view; the library reports its own)
    activations: torch.dtype
    prefill_gemm: torch.dtype       # bf16: prefill GEMMs over bf16 weights run in torch's native bf16
    gemm_seconds: dict | None       # the calibration that chose prefill_gemm, if one ran
    bf16_dot: bool = False          # bf16 weights x bf16-rounded activations with vdpbf16ps
    dot_seconds: dict | None = None     # the calibration that chose bf16_dot, if one ran
    kernels: str = "native"         # the C kernels' build (kernels.VARIANTS)
    forced: tuple[str, ...] = ()    # the choices EngineConfig forced ("prefill_gemm", "bf16_dot", "kernel_isa")
    dense_gemm: str = ""            # float32 | bfloat16 (torch) | amx | vdpbf16ps (our tiles); "": prefill_gemm's
    expert_gemm: str | None = None  # amx | vdpbf16ps: routed bf16 experts' big groups through our tiles
    gemv_amx: bool = False          # the decode GEMV of bf16 weights on AMX tiles (kernels/c/amx_gemv.c)
    gemv_seconds: dict | None = None    # the calibration that chose gemv_amx, if one ran
    att_amx: bool = False           # decode attention's scores and values on AMX tiles (kernels/c/attention_amx.c)
    att_seconds: dict | None = None     # the calibration that chose att_amx, if one ran
    prefill_att: str = "torch"      # causal bf16 prefill attention: torch | amx | vdpbf16ps (kernels/c/prefill_attention.c)
    prefill_att_seconds: dict | None = None     # the calibration that chose prefill_att, if one ran

    def describe(self) -> str:
        t, d = self.gemm_seconds, self.dot_seconds
        dense = self.dense_gemm or str(self.prefill_gemm).removeprefix("torch.")
        shown = {"float32": "float32", "bfloat16": "bfloat16 (torch)", "amx": "bfloat16 (AMX tiles)",
                 "vdpbf16ps": "bfloat16 (vdpbf16ps tiles)"}.get(dense, dense)
        key = {"float32": "fp32", "bfloat16": "bf16"}.get(dense, dense)
        why = (f" ({_said(t)}: {t['fp32'] / t[key]:.2f}x the speed of fp32" if t and key in t
               else " (forced" if "prefill_gemm" in self.forced else "")
        if why:
            e = self.expert_gemm
            why += (f"; experts {e} tiles" + (f" {t['dots_expert'] / t[e + '_expert']:.2f}x the dot products" if t else "")
                    if e else "; experts dot products") + ")"
        dot = (f"; bf16 weights x {'bf16 (vdpbf16ps)' if self.bf16_dot else 'fp32'} activations in the kernels"
               + (f" ({_said(d)}: vdpbf16ps decode GEMV + attention {d['fp32'] / d['bf16']:.2f}x the speed of fp32)" if d
                  else " (forced)" if "bf16_dot" in self.forced else ""))
        build = f" ({self.kernels} kernels, forced)" if "kernel_isa" in self.forced else ""
        return (f"CPU path {self.isa}{build}; activations {str(self.activations).removeprefix('torch.')}; "
                f"prefill GEMM {shown}{why}{dot}{self._describe_gemv()}")

    def _describe_gemv(self) -> str:
        g = self.gemv_seconds
        how = (f" ({_said(g)}: {g['dots'] / g['amx']:.2f}x the speed of the dot tiles at 1+4+16 rows)" if g and "amx" in g
               else " (forced)" if "decode_gemv" in self.forced else "")
        a = self.att_seconds
        att = (f" ({_said(a)}: {a['fp32-1'] / a['amx-1']:.2f}x / {a['fp32-9'] / a['amx-9']:.2f}x the speed of fp32 "
               f"at 1 / 9 rows)" if a and "amx-1" in a else " (forced)" if "decode_attention" in self.forced else "")
        p = self.prefill_att_seconds
        k = self.prefill_att
        pre = (f" ({_said(p)}: {p['torch'] / p[k]:.2f}x the speed of torch's)" if p and k != "torch" and k in p
               else " (forced)" if "prefill_attention" in self.forced else "")
        return (f"; decode GEMV of bf16 weights on {'AMX tiles' if self.gemv_amx else 'dot tiles'}{how}"
                f"; decode attention {'on AMX tiles' if self.att_amx else 'fp32'}{att}"
                f"; prefill attention {PREFILL_ATT_SHOWN[self.prefill_att]}{pre}")


def _said(t: dict) -> str:
    """How a calibration decided, for the ISA line: measured, or too close to call (kernels/interleaved.py)."""
    return "calibrated" if getattr(t, "sure", True) else "too close to call, the default kept"


PREFILL_ATT_SHOWN = {"torch": "torch flash", "amx": "on AMX tiles", "vdpbf16ps": "vdpbf16ps tiles"}


def cpu_choices(weights: torch.dtype, device: torch.device, requested: str, *, kernels: bool,
            flags: frozenset[str], threads: int, measure: Callable[[int], dict] = measure_gemm,
            cache: os.PathLike | None = None,
            measure_dot: Callable[[int], dict] = measure_bf16_dot, gemm: str = "auto", dot: str = "auto",
            kernel_isa: str = "auto", measure_gemv: Callable[..., dict] = measure_amx_gemv,
            gemv: str = "auto", measure_att: Callable[..., dict] | None = None, att: str = "auto",
            measure_patt: Callable[..., dict] | None = None, patt: str = "auto") -> CpuChoices:
    """The CPU choices; gemm / dot / kernel_isa / gemv / att / patt are EngineConfig's forcing options ("auto": decide)."""
    act = activation_dtype(weights, device, requested, kernels=kernels, flags=flags)
    dense, expert = "", None
    if device.type == "cpu" and weights == torch.bfloat16:
        dense, expert, t = prefill_gemm_choice(requested, act, kernels=kernels, flags=flags, threads=threads,
                                               measure=measure, cache=cache, forced=gemm)
        g = torch.float32 if dense == "float32" else torch.bfloat16
    else:
        g, t = act, None
    d, dt = (bf16_dot_choice(requested, weights, kernels=kernels, flags=flags, threads=threads,
                             measure=measure_dot, cache=cache, forced=dot) if device.type == "cpu" else (False, None))
    a, at = (amx_gemv_choice(requested, weights, kernels=kernels, flags=flags, threads=threads, bf16_dot=d,
                             measure=measure_gemv, cache=cache, forced=gemv) if device.type == "cpu" else (False, None))
    m, mt = (att_amx_choice(weights, kernels=kernels, flags=flags, threads=threads, measure=measure_att, cache=cache,
                            forced=att) if device.type == "cpu" else (False, None))
    p, pt = (prefill_att_choice(weights, kernels=kernels, flags=flags, threads=threads, measure=measure_patt,
                                cache=cache, forced=patt) if device.type == "cpu" else ("torch", None))
    forced = tuple(n for n, v in (("prefill_gemm", gemm), ("bf16_dot", dot), ("kernel_isa", kernel_isa),
                                  ("decode_gemv", gemv), ("decode_attention", att), ("prefill_attention", patt))
                   if v != "auto")
    return CpuChoices(isa_level(flags), act, g, t, d, dt, kernel_variant(kernel_isa), forced, dense, expert, a, at,
                      m, mt, p, pt)


def kernel_variant(requested: str) -> str:
    """The C kernels' build for EngineConfig.kernel_isa ("auto": the CPU's widest, "native")."""
    return "native" if requested == "auto" else requested


@functools.cache
def machine_choices(weights: torch.dtype, device: torch.device, requested: str, kernels: bool,
                    threads: int, gemm: str = "auto", dot: str = "auto", kernel_isa: str = "auto",
                    gemv: str = "auto", att: str = "auto", patt: str = "auto") -> CpuChoices:
    """`resolve` for this machine, calibration cached under the kernels' cache dir; logged once
    per distinct set of options (so one process runs the same choices for every load of a model)."""
    c = cpu_choices(weights, device, requested, kernels=kernels, flags=cpu_flags(), threads=threads,
                cache=cache_dir(), gemm=gemm, dot=dot, kernel_isa=kernel_isa, gemv=gemv, att=att, patt=patt)
    if device.type == "cpu":
        log.info("%s", c.describe())
    return c


def model_kernels(cfg) -> tuple[object, CpuChoices]:
    """(the kernel pool or None, the CPU choices) of one model build, from its BuildContext:
    the pool of the chosen kernel build, its bf16-dot switch set to the choice."""
    device = cfg.torch_device
    variant = kernel_variant(cfg.kernel_isa)
    pool = None
    if device.type == "cpu":
        if variant not in variants_here():
            raise InvalidRequestError(f"kernel_isa: {variant!r} does not run on this CPU; expected one of "
                                      f"{'|'.join(['auto', *variants_here()])}")
        pool = shared_pool(cfg.num_threads, isa=variant, spin_us=cfg.spin_us)
    c = machine_choices(cfg.torch_dtype, device, cfg.compute_dtype, pool is not None,
                        pool.num_threads if pool is not None else 1, cfg.prefill_gemm, cfg.bf16_dot, cfg.kernel_isa,
                        cfg.decode_gemv, cfg.decode_attention, cfg.prefill_attention)
    if pool is not None:
        require_loading("a model build")    # its choices set the process switches: only inside a load
        pool.lib.ft_set_bf16_dot(int(c.bf16_dot))
        set_gemv_amx(pool.lib, c)
        set_att_amx(pool.lib, c)
        set_prefill_att(pool.lib, c)
        pool.lib.ft_set_ggml_act(act_mode(cfg.ggml_numerics))
        pool.lib.ft_set_ggml_k256(int(ggml_k256_choice(cfg.ggml_numerics, variant, pool.num_threads)))
        pool.lib.ft_set_int8_zmm(int(int8_zmm_choice(pool.lib, variant, pool.num_threads, forced=cfg.int8_tiles)))
        set_gemm_tiles(pool.lib, c)
        set_ggml_tiles(pool.lib, c, cfg.ggml_numerics, cfg.prefill_gemm)
    return pool, c


K256_MARGIN = 0.97      # the per-256 rounding changes the numerics: only for a clear win, not a noisy tie


def ggml_k256_choice(numerics: str, isa: str, threads: int, measure: Callable[..., dict] = measure_k256,
                     cache: os.PathLike | None = None) -> bool:
    """Whether the k-quant rows of decode-sized calls read per-256 activations (kernels/ggml_k256.py):
    forced by ggml_numerics "q8k", never under "q8" / "llama" / "llama-exact" / "float32" (their
    rounding is promised), calibrated under "auto" (Q4_K + Q6_K GEMVs from DRAM, both ways) on
    this kernel build, cached per CPU model and thread count like the other choices; on where it
    measured at least 3% faster."""
    if numerics != "auto":
        return numerics == "q8k"
    flags = cpu_flags()
    on, t = _calibrated(cache if cache is not None else cache_dir(), f"ggmlk256:q4k-q6k-dram-m1-4:{cpu_model()}:{isa}",
                        flags, threads, lambda: measure(threads, isa), lambda t: t["q8k"] < K256_MARGIN * t["q8"], False)
    log.debug("k-quant decode activations per %s (calibrated: per 256 at %.2fx the speed of per 32)",
              256 if on else 32, t["q8"] / t["q8k"])
    return on


def int8_zmm_choice(lib, isa: str, threads: int, measure: Callable[..., dict] = measure_int8_tiles,
                    cache: os.PathLike | None = None, forced: str = "auto") -> bool:
    """Whether the int8 / mxfp4 dots run on the zmm tiles (kernels/int8_tiles.py: the ymm tiles'
    bits, so speed alone decides): `forced` (EngineConfig.int8_tiles) ymm | zmm (zmm where the
    build has no AVX-512: a clear error), else where the build has them, calibrated (one expert's
    prefill-shaped call in both formats, both ways), cached per CPU model and thread count like the
    other choices."""
    was = lib.ft_set_int8_zmm(-1)
    runs = lib.ft_set_int8_zmm(1)
    lib.ft_set_int8_zmm(was)
    if forced == "zmm" and not runs:
        raise InvalidRequestError("int8_tiles: 'zmm' does not run here (the zmm tiles need an AVX-512 kernel "
                                  "build); expected one of auto|ymm")
    if forced != "auto" or not runs:
        return forced == "zmm"
    on, t = _calibrated(cache if cache is not None else cache_dir(), f"int8zmm:e2048x768-t64:{cpu_model()}:{isa}",
                        cpu_flags(), threads, lambda: measure(threads, isa), lambda t: t["zmm"] < t["ymm"], False)
    log.debug("int8 / mxfp4 expert tiles in %s registers (calibrated: zmm at %.2fx the speed of ymm)",
              "zmm" if on else "ymm", t["ymm"] / t["zmm"])
    return on


def set_ggml_tiles(lib, c: CpuChoices, numerics: str, forced: str = "auto") -> int:
    """Switch the prefill tiles of experts in llama.cpp block types (kernels/c/ggml_tiles.c) to the
    experts' tiles choice (calibrated on bf16 experts, whose dots cost less than the ggml ones) or
    to a forced prefill_gemm amx | vdpbf16ps (whatever the dtype), under ggml_numerics "auto" only:
    "q8" and "llama" promise the int8 dots, "float32" exact activations. Returns the mode in
    effect (0: the dots)."""
    mode = forced if forced in ("amx", "vdpbf16ps") else c.expert_gemm
    code = 0
    if mode and numerics == "auto":
        code = mode_code(lib, mode) if forced != "auto" else GEMM_MODES[mode] if mode in modes_here(lib) else 0
    return lib.ft_set_ggml_tiles(code, GGML_GROUP_MIN)


def set_gemm_tiles(lib, c: CpuChoices) -> None:
    """Switch the library's prefill GEMM tiles to the choices (a forced mode this CPU refuses, AMX
    without the OS's grant, is a clear error)."""
    wanted = {c.dense_gemm, c.expert_gemm} & {"amx", "vdpbf16ps"}
    if "prefill_gemm" in c.forced:     # forced: vdpbf16ps emulated where the build lacks it, AMX or an error
        codes = {m: mode_code(lib, m) for m in wanted}
    else:                               # calibrated on the native build: a narrower forced build goes without
        codes = {m: GEMM_MODES[m] if m in modes_here(lib) else 0 for m in wanted}
    refused = [m for m, code in codes.items() if not code and "prefill_gemm" in c.forced]
    if refused:
        raise InvalidRequestError(f"prefill_gemm: {refused[0]!r} tiles do not run here (AMX needs the CPU's "
                                  f"amx_bf16 and the OS's grant of the tile state); expected one of "
                                  f"auto|float32|bfloat16|vdpbf16ps")
    e = codes.get(c.expert_gemm, 0)
    lib.ft_set_gemm(e, EXPERT_MIN_TOKENS, codes.get(c.dense_gemm, 0))
    set_tiles_rounding(EXPERT_MIN_TOKENS if e else 0)     # the torch expert executors round the same calls


def set_gemv_amx(lib, c: CpuChoices) -> None:
    """Switch the library's decode GEMV of bf16 weights to the choice (calibrated on the native
    build: a narrower forced build goes without; AMX forced where it does not run: a clear error)."""
    if lib.ft_set_gemv_amx(int(c.gemv_amx)) != int(c.gemv_amx) and "decode_gemv" in c.forced:
        raise InvalidRequestError("decode_gemv: 'amx' does not run here (AMX needs the CPU's amx_bf16 and the OS's "
                                  "grant of the tile state); expected one of auto|dots")


def set_att_amx(lib, c: CpuChoices) -> None:
    """Switch the library's decode attention over bf16 caches to the choice (calibrated on the
    native build: a narrower forced build goes without; AMX forced where it does not run: a clear
    error)."""
    if lib.ft_set_att_amx(int(c.att_amx)) != int(c.att_amx) and "decode_attention" in c.forced:
        raise InvalidRequestError("decode_attention: 'amx' does not run here (AMX needs the CPU's amx_bf16 and the "
                                  "OS's grant of the tile state); expected one of auto|fp32")


def set_prefill_att(lib, c: CpuChoices) -> None:
    """Switch the library's causal bf16 prefill attention to the choice (calibrated on the native
    build: a narrower forced build goes without; a kernel forced where it does not run: a clear error)."""
    mode = PREFILL_ATT_MODES[c.prefill_att]
    if lib.ft_set_prefill_att(mode) != mode and "prefill_attention" in c.forced:
        raise InvalidRequestError(f"prefill_attention: {c.prefill_att!r} does not run here (AMX needs the CPU's "
                                  "amx_bf16 and the OS's grant of the tile state, vdpbf16ps AVX512-BF16); "
                                  "expected auto, torch or the kernel this CPU runs")
