"""Builds the C kernels (routed experts, dense GEMV, dequantization) at first use and loads them with ctypes.

The sources in c/ (one file per concept, one shared header) are compiled in one compiler call
with the system C compiler (`$CC`, else cc/gcc/clang) and `-march=native`, cached under `$XDG_CACHE_HOME/freetoken/kernels/` (default ~/.cache) keyed
by a hash of the sources, the compiler, the flags and the CPU, and published with an atomic
rename so concurrent first uses are safe. No compiler -> `load()` returns None and callers
fall back to torch."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..platform import cpu_signature

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).with_name("c")
VARIANTS = {
    "native": ["-march=native"],
    "avx2": ["-march=native", "-DFT_NO_AVX512"],      # the AVX2 paths, on an AVX-512 machine too
    "portable": ["-DFT_PORTABLE"],
}
_BASE_FLAGS = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-pthread", "-fno-math-errno"]
_loaded: dict[str, ctypes.CDLL | None] = {}
_switch_libraries: dict[str, tuple[ctypes.CDLL, tuple[int, ...]]] = {}   # each library and its switches as built


class Desc(ctypes.Structure):
    _fields_ = [
        ("fmt", ctypes.c_int32), ("act", ctypes.c_int32), ("H", ctypes.c_int32), ("I", ctypes.c_int32),
        ("alpha", ctypes.c_float), ("limit", ctypes.c_float), ("n_experts", ctypes.c_int64),
        ("gu_w", ctypes.c_void_p), ("gu_w_es", ctypes.c_int64), ("gu_w_rs", ctypes.c_int64),
        ("gu_s", ctypes.c_void_p), ("gu_s_es", ctypes.c_int64), ("gu_s_rs", ctypes.c_int64),
        ("dn_w", ctypes.c_void_p), ("dn_w_es", ctypes.c_int64), ("dn_w_rs", ctypes.c_int64),
        ("dn_s", ctypes.c_void_p), ("dn_s_es", ctypes.c_int64), ("dn_s_rs", ctypes.c_int64),
        ("gu_b", ctypes.c_void_p), ("dn_b", ctypes.c_void_p),
        # the up rows in a bank of their own (ggml), else None: rows I.. of gu_w
        ("up_w", ctypes.c_void_p), ("up_w_es", ctypes.c_int64), ("up_w_rs", ctypes.c_int64),
    ]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "freetoken" / "kernels"


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


c_compiler = _compiler      # public: other C built at first use (server/replicas/loopback.py) uses it too


def sources() -> list[Path]:
    """The C files of the one shared library (compiled together in one compiler call)."""
    return sorted(SOURCE_DIR.glob("*.c"))


@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """sha256 of the kernels' C sources (names and bytes): the build cache's key, and the
    calibrations' (kernels/choices.py), so a changed kernel is built and timed afresh."""
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes()
                                   for p in sorted(SOURCE_DIR.glob("*.[ch]")))).hexdigest()


def _build(cc: str, flags: list[str]) -> Path:
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(sources_digest().encode() + ver.encode() + " ".join(flags).encode()
                         + cpu_signature().encode()).hexdigest()[:16]
    out = cache_dir() / f"cpu_kernels-{key}.so"
    if out.exists():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError:   # read-only home: a per-user temp dir instead
        out = Path(tempfile.gettempdir()) / f"freetoken-kernels-{os.getuid()}" / out.name
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
    return link_atomically(out, lambda tmp: [cc, *_BASE_FLAGS, *flags, *map(str, sources()), "-o", tmp, "-lm"])


def link_atomically(out: Path, command) -> Path:
    """Run the compiler `command(tmp)` writing a library to a temporary file beside `out`, then
    rename it into place, so concurrent first uses never load half a library. RuntimeError with
    the compiler's message when it fails."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        cmd = command(tmp)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ft_isa.restype = ctypes.c_char_p
    lib.ft_set_bf16_dot.argtypes = [ctypes.c_int]
    lib.ft_set_bf16_dot.restype = ctypes.c_int
    lib.ft_set_ggml_act.argtypes = [ctypes.c_int]
    lib.ft_set_ggml_act.restype = ctypes.c_int
    lib.ft_set_ggml_k256.argtypes = [ctypes.c_int]
    lib.ft_set_ggml_k256.restype = ctypes.c_int
    if hasattr(lib, "ft_set_int8_zmm"):    # absent from revisions before it (bench trees' older builds)
        lib.ft_set_int8_zmm.argtypes = [ctypes.c_int]
        lib.ft_set_int8_zmm.restype = ctypes.c_int
    lib.ft_moe_run.argtypes = [vp, ctypes.POINTER(Desc), vp, ctypes.c_int, i64, i64, vp, vp, vp]
    lib.ft_moe_run.restype = ctypes.c_int
    lib.ft_moe_run_ranked.argtypes = [vp, ctypes.POINTER(Desc), vp, ctypes.c_int, i64, i64, vp, vp, vp, vp]
    lib.ft_moe_run_ranked.restype = ctypes.c_int
    lib.ft_moe_run_pairs.argtypes = [vp, ctypes.POINTER(Desc), vp, ctypes.c_int, i64, i64, vp, vp]
    lib.ft_moe_run_pairs.restype = ctypes.c_int
    lib.ft_moe_combine.argtypes = [i64, i64, i64, vp, vp, vp, vp, vp]
    lib.ft_moe_combine.restype = None
    lib.ft_read_bytes.argtypes = [vp, vp, i64]
    lib.ft_read_bytes.restype = ctypes.c_double
    ci = ctypes.c_int
    lib.ft_linear_run.argtypes = [vp, ci, vp, i64, vp, i64, ci, ci, vp, ci, i64, vp, vp]
    lib.ft_linear_run.restype = ci
    lib.ft_ggml_linear_run.argtypes = [vp, vp, ci, ci, vp, ci, i64, vp, vp, i64]
    lib.ft_ggml_linear_run.restype = ci
    lib.ft_dequant_rows.argtypes = [vp, ci, vp, i64, vp, i64, ci, ci, vp]
    lib.ft_dequant_rows.restype = None
    lib.ft_decode_attention.argtypes = [vp, vp, ci, ci, ci, ci, vp, vp, ci, vp, i64, vp, ctypes.c_float, vp, vp]
    lib.ft_decode_attention.restype = ci
    lib.ft_rms_norm.argtypes = [vp, vp, i64, ci, ctypes.c_float, vp]
    lib.ft_rms_norm.restype = None
    lib.ft_rope.argtypes = [vp, vp, vp, i64, ci, ci, ci, vp]
    lib.ft_rope.restype = None
    lib.ft_kv_write.argtypes = [vp, i64, vp, i64, i64, i64, vp, i64, vp, vp, ci]
    lib.ft_kv_write.restype = ci
    lib.ft_add_rms_norm.argtypes = [vp, vp, vp, i64, ci, ctypes.c_float, vp, vp]
    lib.ft_add_rms_norm.restype = None
    lib.ft_norm_rope_qk.argtypes = [vp, i64, i64, ci, ci, ci, ci, vp, ctypes.c_float, vp, ctypes.c_float, vp, vp, vp]
    lib.ft_norm_rope_qk.restype = ci
    lib.ft_q4_1_exact.argtypes = [vp, vp, vp, ci, vp, vp, vp, ci, ci, ci, vp, i64]
    lib.ft_q4_1_exact.restype = None
    lib.ft_dot16_exact.argtypes = [vp, i64, vp, i64, ci, ci, ci, vp, i64, ci]
    lib.ft_dot16_exact.restype = None
    if hasattr(lib, "ft_argmax"):     # (bench trees' older builds lack it)
        lib.ft_argmax.argtypes = [vp, i64]
        lib.ft_argmax.restype = i64
    lib.ft_route_topk.argtypes = [vp, i64, ci, ci, ci, ci, vp, vp]
    lib.ft_route_topk.restype = None
    lib.ft_moe_decode.argtypes = [vp, ctypes.POINTER(Desc), vp, ci, ci, ci, ci, i64, vp, ci, i64, vp, vp, vp, vp]
    lib.ft_moe_decode.restype = ci
    lib.ft_gemm_bf16.argtypes = [vp, ci, vp, i64, ci, ci, vp, i64, i64, vp, vp, i64]
    lib.ft_gemm_bf16.restype = ci
    lib.ft_gemm_stream.argtypes = [i64]
    lib.ft_gemm_stream.restype = i64
    lib.ft_gemm_copy_once.argtypes = [ci]
    lib.ft_gemm_copy_once.restype = ci
    lib.ft_gemm_modes.argtypes = []
    lib.ft_gemm_modes.restype = ci
    lib.ft_get_gemm.argtypes = [ci]
    lib.ft_get_gemm.restype = ci
    lib.ft_set_gemm.argtypes = [ci, ci, ci]
    lib.ft_set_gemm.restype = ci
    lib.ft_set_ggml_tiles.argtypes = [ci, ci]
    lib.ft_set_ggml_tiles.restype = ci
    lib.ft_ggml_rows_bf16.argtypes = [ci, vp, i64, ci, ci, vp]
    lib.ft_ggml_rows_bf16.restype = None
    lib.ft_set_gemv_amx.argtypes = [ci]
    lib.ft_set_gemv_amx.restype = ci
    if hasattr(lib, "ft_set_att_amx"):     # absent from revisions before it (bench/decode_attention.build_revision)
        lib.ft_set_att_amx.argtypes = [ci]
        lib.ft_set_att_amx.restype = ci
    return _bind_prefill_attention(_bind_switches(_bind_probes(_bind_layer_calls(_bind_tier(_bind_pool(lib))))))


def _bind_tier(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The expert tiers' bookkeeping helpers: the next-layer predictor (c/next_layer.c), the slot
    table's victims (c/slot_victims.c), one expert's disk read (c/expert_read.c), the host cache's
    hit path (c/host_hits.c)."""
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ft_next_layer_observe.argtypes = [vp, vp, vp, i64, vp, i64, i64]
    lib.ft_next_layer_observe.restype = i64
    lib.ft_next_layer_predict.argtypes = [vp, vp, vp, i64, i64, ctypes.c_double, vp, vp]
    lib.ft_next_layer_predict.restype = i64
    lib.ft_slot_victims.argtypes = [i64, vp, vp, vp, vp, vp, vp, i64, i64, i64, i64, vp]
    lib.ft_slot_victims.restype = i64
    lib.ft_read_expert.argtypes = [i64, vp, vp, vp, vp, vp, i64, i64, vp, vp, vp, vp, vp]
    lib.ft_read_expert.restype = i64
    lib.ft_hits_acquire.argtypes = [vp, vp, i64, vp, i64, vp, vp, vp, vp]
    lib.ft_hits_acquire.restype = i64
    lib.ft_hits_release.argtypes = [vp, vp, i64]
    lib.ft_hits_release.restype = None
    lib.ft_hits_route.argtypes = [vp, i64, i64, vp, vp]
    lib.ft_hits_route.restype = i64
    return lib


def _bind_pool(lib: ctypes.CDLL) -> ctypes.CDLL:
    """c/pool.c's calls: the kernels' worker pool."""
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ft_pool_create.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), i64, i64]
    lib.ft_pool_create.restype = vp
    lib.ft_pool_destroy.argtypes = [vp]
    lib.ft_pool_size.argtypes = [vp]
    if hasattr(lib, "ft_pool_park"):     # absent from revisions before it (bench trees' older builds)
        lib.ft_pool_park.argtypes = [vp]
        lib.ft_pool_park.restype = None
        lib.ft_pool_sleeping.argtypes = [vp]
    return lib


def _bind_prefill_attention(lib: ctypes.CDLL) -> ctypes.CDLL:
    """c/prefill_attention.c's calls, where the library has them (bench trees' older builds)."""
    vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    if hasattr(lib, "ft_set_prefill_att"):
        lib.ft_set_prefill_att.argtypes = [ci]
        lib.ft_set_prefill_att.restype = ci
    plain = [vp, vp, i64, i64, ci, ci, ci, ci, vp, i64, i64, vp, i64, i64, i64, ctypes.c_float, vp, i64, i64]
    if hasattr(lib, "ft_prefill_attention"):
        lib.ft_prefill_attention.argtypes = plain
        lib.ft_prefill_attention.restype = ci
    if hasattr(lib, "ft_prefill_attention_sinks"):      # + sinks [Hq] fp32 or NULL, window (0: none)
        lib.ft_prefill_attention_sinks.argtypes = plain + [vp, i64]
        lib.ft_prefill_attention_sinks.restype = ci
    return lib


def _bind_switches(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The switches' one array (c/switches.c), where the library has it (bench trees' older builds)."""
    if hasattr(lib, "ft_switches"):
        # no argtypes: called with ctypes int arrays or None only (switch_set.py), twice a step, and
        # ctypes' argument conversion was half of each call (1.0 -> 0.5 µs)
        lib.ft_switches.restype = ctypes.c_int
    return lib


def _bind_layer_calls(lib: ctypes.CDLL) -> ctypes.CDLL:
    """A decode row's layer-sized calls (attn_half.c: the attention half, the MoE block + residual,
    and that block counting its experts) and the whole stack of them (layers_row.c)."""
    vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ft_attn_half.argtypes = [vp, vp, vp, vp, vp, vp, i64, vp, vp, ci, vp, i64, vp, vp, vp, vp]
    lib.ft_attn_half.restype = ci
    if hasattr(lib, "ft_attn_half_rows"):     # (bench trees' older builds lack it)
        lib.ft_attn_half_rows.argtypes = [vp, vp, i64, vp, vp, vp, vp, vp, i64, vp, vp, ci, vp, i64, vp, vp, vp, vp]
        lib.ft_attn_half_rows.restype = ci
    lib.ft_moe_decode_add.argtypes = [vp, ctypes.POINTER(Desc), vp, ci, ci, ci, ci, i64, vp, ci, i64, vp, vp, vp, vp,
                                      vp, vp]
    lib.ft_moe_decode_add.restype = ci
    lib.ft_moe_row.argtypes = [vp, ctypes.POINTER(Desc), vp, ci, ci, ci, ci, i64, vp, ci, vp, vp, vp, vp, vp, vp, vp]
    lib.ft_moe_row.restype = ci
    if hasattr(lib, "ft_layers_row"):     # (bench trees' older builds lack it)
        lib.ft_layers_row.argtypes = [vp, vp, i64, vp, vp, vp, vp, vp, i64, vp, vp, vp, ci, ctypes.c_float, vp, vp]
        lib.ft_layers_row.restype = ci
    return lib


def _bind_probes(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The machine probes' signatures (kernels/roofline.py: AMX, peak rates, clock)."""
    vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ft_amx_ready.argtypes = []
    lib.ft_amx_ready.restype = ci
    lib.ft_amx_tile_probe.argtypes = [ci, i64, vp]
    lib.ft_amx_tile_probe.restype = i64
    lib.ft_peak_macs.argtypes = [vp, ci, i64]
    lib.ft_peak_macs.restype = i64
    lib.ft_peak_bursts.argtypes = [vp, ci, i64, ci, vp]
    lib.ft_peak_bursts.restype = i64
    lib.ft_core_hz.argtypes = [vp, i64, vp]
    lib.ft_core_hz.restype = None
    return lib


def variants_here() -> list[str]:
    """The kernel variants this CPU runs, widest first: "native", then "avx2" where native is
    wider (AVX-512) and the CPU has AVX2, then "portable": what the tests check one by one."""
    native = load("native")
    out = ["native"]
    if native is not None and native.ft_isa().decode().startswith("avx512"):
        out.append("avx2")
    return out + ["portable"]


def switch_libraries() -> dict[str, tuple[ctypes.CDLL, tuple[int, ...]]]:
    """The loaded libraries that have the switches' array (c/switches.c), by variant, each with
    its values as built: what kernels/switch_set.py reads and writes (the one dict, kept as
    libraries load: a caller only reads it)."""
    return _switch_libraries


def read_switches(lib: ctypes.CDLL) -> tuple[int, ...]:
    """A library's switches now, in c/switches.c's order."""
    vals = (ctypes.c_int * lib.ft_switches(None, None))()
    lib.ft_switches(vals, None)
    return tuple(vals)


def cpu_kernels() -> ctypes.CDLL | None:
    """The native library (built on first call), or None: for the small per-op helpers."""
    return _loaded["native"] if "native" in _loaded else load("native")


def load(variant: str = "native") -> ctypes.CDLL | None:
    """The compiled kernel library for `variant` ("native", "avx2" or "portable"), or None when it
    cannot be built here (a warning is logged once)."""
    if variant in _loaded:
        return _loaded[variant]
    lib = None
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler found: CPU experts fall back to torch (slow)")
    else:
        attempts = [VARIANTS[variant]] + ([[]] if variant == "native" else [])
        for flags in attempts:
            try:
                lib = _bind(ctypes.CDLL(str(_build(cc, flags))))
                break
            except (RuntimeError, OSError) as e:
                log.warning("building CPU expert kernels with %s failed: %s", flags, e)
    _loaded[variant] = lib
    if lib is not None and hasattr(lib, "ft_switches"):
        _switch_libraries[variant] = (lib, read_switches(lib))
    return lib
