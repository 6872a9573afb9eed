"""The automatic choices (activations dtype, prefill GEMM dtype, ISA level) with faked CPU flags
and a faked calibration."""
import pytest
import torch

from freetoken import kernels
from freetoken.kernels import choices
from freetoken.kernels.choices import isa_level, cpu_choices, measure_att_amx, measure_prefill_att
from freetoken.errors import InvalidRequestError

CPU = torch.device("cpu")
ZEN4 = frozenset("avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16".split())
SPR = ZEN4 | {"amx_bf16", "amx_int8", "amx_tile"}
AVX2 = frozenset("avx avx2 fma f16c".split())
OLD = frozenset("sse2 sse4_2".split())


class Calibration:
    def __init__(self, fp32, bf16):
        self.t, self.calls = {"fp32": fp32, "bf16": bf16}, 0

    def __call__(self, threads):
        self.calls += 1
        return dict(self.t)


class DotCalibration(Calibration):
    """The bf16-dot calibration: seconds per row count of DOT_MIX ("fp32-<rows>", "bf16-<rows>"),
    a number for the same at every row count, and their mix ("fp32", "bf16") as measured."""
    def __init__(self, fp32, bf16):
        def rows(v):
            return v if isinstance(v, dict) else dict.fromkeys(choices.DOT_MIX, v)
        t = {f"{m}-{r}": s for m, v in (("fp32", fp32), ("bf16", bf16)) for r, s in rows(v).items()}
        self.t, self.calls = dict(t, fp32=choices.dot_mix_seconds(t, "fp32"), bf16=choices.dot_mix_seconds(t, "bf16")), 0


@pytest.fixture(autouse=True)
def att_calibrated_fp32(monkeypatch):
    """Tests of the other choices pick on flags with AMX: their attention calibrations say fp32 and
    torch (measured here only where a test asks the library itself)."""
    monkeypatch.setattr(choices, "measure_att_amx", lambda threads: {"fp32-1": 1.0, "fp32-9": 1.0})
    monkeypatch.setattr(choices, "measure_prefill_att", lambda threads: {"torch": 1.0})


def test_isa_level():
    assert isa_level(ZEN4) == isa_level(SPR) == "avx512"
    assert isa_level(AVX2) == "avx2"
    assert isa_level(OLD) == isa_level(frozenset()) == "portable"
    assert isa_level(AVX2 | {"avx512f"}) == "avx2"       # F alone (no BW/VL): the AVX2 path


def test_bf16_checkpoint_on_avx512_bf16_cpu_decodes_in_fp32():
    """The measured regression: bf16 activations on AVX512-BF16 CPUs. With the kernels, auto is
    float32 activations on every ISA."""
    for flags in (ZEN4, SPR, AVX2, OLD):
        c = cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=flags, threads=2, measure=Calibration(2, 1))
        assert c.activations == torch.float32


def test_prefill_gemm_follows_the_calibration_only_where_bf16_is_native(tmp_path):
    fast, slow = Calibration(fp32=2.0, bf16=1.0), Calibration(fp32=1.0, bf16=3.0)
    assert cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=ZEN4, threads=2, measure=fast).prefill_gemm \
        == torch.bfloat16
    assert cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=ZEN4, threads=2, measure=slow).prefill_gemm \
        == torch.float32
    never = Calibration(fp32=2.0, bf16=1.0)
    c = cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=AVX2, threads=2, measure=never)
    assert c.prefill_gemm == torch.float32 and c.gemm_seconds is None and never.calls == 0


def test_calibration_is_cached_per_machine(tmp_path):
    cal = Calibration(fp32=2.0, bf16=1.0)
    for _ in range(3):
        c = cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=SPR, threads=2, measure=cal, cache=tmp_path)
        assert c.prefill_gemm == torch.bfloat16
    assert cal.calls == 1
    cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=SPR, threads=4, measure=cal, cache=tmp_path)
    cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=ZEN4, threads=2, measure=cal, cache=tmp_path)
    assert cal.calls == 3                              # another thread count or CPU measures again
    (next(tmp_path.iterdir())).write_text("not json")
    cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=SPR, threads=2, measure=cal, cache=tmp_path)


def test_explicit_dtype_and_other_cases():
    cal = Calibration(fp32=2.0, bf16=1.0)
    c = cpu_choices(torch.bfloat16, CPU, "float32", kernels=True, flags=SPR, threads=2, measure=cal)
    assert (c.activations, c.prefill_gemm, cal.calls) == (torch.float32, torch.float32, 0)
    c = cpu_choices(torch.bfloat16, CPU, "bfloat16", kernels=True, flags=AVX2, threads=2, measure=cal)
    assert c.activations == torch.bfloat16
    # no compiler: torch's own bf16 ops, worth it only with native bf16
    assert cpu_choices(torch.bfloat16, CPU, "auto", kernels=False, flags=SPR, threads=2, measure=cal).activations \
        == torch.bfloat16
    assert cpu_choices(torch.bfloat16, CPU, "auto", kernels=False, flags=AVX2, threads=2, measure=cal).activations \
        == torch.float32
    assert cpu_choices(torch.float32, CPU, "auto", kernels=True, flags=SPR, threads=2, measure=cal).activations \
        == torch.float32
    cuda = cpu_choices(torch.bfloat16, torch.device("cuda"), "auto", kernels=False, flags=SPR, threads=2, measure=cal)
    assert cuda.activations == cuda.prefill_gemm == torch.bfloat16
    assert cal.calls == 0
    assert "avx512" in cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=SPR, threads=2,
                               measure=Calibration(2, 1)).describe()



def test_bf16_dot_only_under_auto_with_vdpbf16ps_and_when_measured_faster(tmp_path):
    fast, slow = DotCalibration(fp32=2.0, bf16=1.0), DotCalibration(fp32=1.0, bf16=1.5)
    gemm = Calibration(2, 1)
    pick = lambda flags, dot, requested="auto", weights=torch.bfloat16, kernels=True: cpu_choices(  # noqa: E731
        weights, CPU, requested, kernels=kernels, flags=flags, threads=2, measure=gemm, measure_dot=dot)
    assert pick(ZEN4, fast).bf16_dot and pick(SPR, fast).bf16_dot
    assert "vdpbf16ps" in pick(ZEN4, fast).describe()
    assert not pick(ZEN4, slow).bf16_dot and pick(ZEN4, slow).dot_seconds == slow.t
    never = DotCalibration(fp32=2.0, bf16=1.0)
    for flags in (AVX2, OLD, AVX2 | {"avx512_bf16"}, ZEN4 - {"avx512_bf16"}):   # no vdpbf16ps / no AVX-512
        assert not pick(flags, never).bf16_dot
    assert not pick(ZEN4, never, requested="float32").bf16_dot           # explicit: exact fp32 activations
    assert not pick(ZEN4, never, weights=torch.float16).bf16_dot
    assert not pick(ZEN4, never, kernels=False).bf16_dot
    assert never.calls == 0
    cached = DotCalibration(fp32=2.0, bf16=1.0)
    for _ in range(2):
        assert cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=ZEN4, threads=2, measure=gemm,
                       measure_dot=cached, cache=tmp_path).bf16_dot
    assert cached.calls == 1


def test_bf16_dot_weighs_a_verify_rows_against_the_plain_step():
    """The measured case (Zen 4, the dense bench model): the vdpbf16ps GEMV 11% slower at 1 row but
    0.7x at 9 rows stays off (free-running output runs 1-row steps only); at par or within 2% at 1
    row and faster at a verify's rows, on; faster at 1 row but slower over the mix, off."""
    def pick(fp32, bf16):
        return cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=ZEN4, threads=2,
                           measure=Calibration(2, 1), measure_dot=DotCalibration(fp32, bf16)).bf16_dot
    fp32 = {1: 16.4, 5: 24.6, 9: 37.4}
    assert not pick(fp32, {1: 18.3, 5: 22.3, 9: 26.4})             # plain 1.11x: off
    assert pick(fp32, {1: 16.4, 5: 18.0, 9: 20.0})                 # at par plain, verifies cheaper: on
    assert pick(fp32, {1: 16.7, 5: 18.0, 9: 20.0})                 # within DOT_PLAIN_MARGIN
    assert not pick(fp32, {1: 16.0, 5: 30.0, 9: 45.0})             # plain faster, the verifies lose more
    assert pick(fp32, {1: 16.0, 5: 24.6, 9: 37.4})                 # faster plain, at par verifying


def test_bf16_dot_calibration_runs_the_library_here():
    from freetoken.kernels import cpu_kernels
    from freetoken.kernels.choices import measure_bf16_dot
    if cpu_kernels() is None:
        return
    t = measure_bf16_dot(1, n=256, k=512, reps=1)
    rows = {f"{m}-{r}" for m in ("fp32", "bf16") for r in choices.DOT_MIX}
    assert set(t) == rows | {"fp32", "bf16"} and all(v > 0 for v in t.values())


def test_forced_choices_win_and_skip_the_calibrations():
    cal, dot = Calibration(fp32=1.0, bf16=3.0), DotCalibration(fp32=1.0, bf16=3.0)   # auto would say fp32, off
    c = cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=AVX2, threads=2, measure=cal, measure_dot=dot,
                gemm="bfloat16", dot="on", kernel_isa="portable")
    assert (c.prefill_gemm, c.bf16_dot, c.kernels) == (torch.bfloat16, True, "portable")
    assert cal.calls == dot.calls == 0 and c.forced == ("prefill_gemm", "bf16_dot", "kernel_isa")
    assert "forced" in c.describe()
    c = cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=SPR, threads=2, measure=Calibration(2, 1),
                measure_dot=DotCalibration(2, 1), gemm="float32", dot="off")
    assert (c.prefill_gemm, c.bf16_dot, c.kernels) == (torch.float32, False, "native")
    # the dot applies to bf16 weights in the kernels only
    assert not cpu_choices(torch.float32, CPU, "auto", kernels=True, flags=SPR, threads=2, dot="on").bf16_dot


def test_forcing_options_are_checked():
    import pytest

    from freetoken.config import EngineConfig
    from freetoken.errors import InvalidRequestError
    for name, bad in (("prefill_gemm", "fp16"), ("bf16_dot", "yes"), ("kernel_isa", "avx512"), ("decode_gemv", "on"),
                      ("decode_attention", "bf16"), ("prefill_attention", "on")):
        with pytest.raises(InvalidRequestError, match=name):
            EngineConfig(model="m", **{name: bad})


class GemvCalibration:
    def __init__(self, dots, amx=None):
        self.t, self.calls, self.dot = {"dots": dots} | ({"amx": amx} if amx is not None else {}), 0, []

    def __call__(self, threads, bf16_dot):
        self.calls += 1
        self.dot.append(bf16_dot)
        return dict(self.t)


def test_amx_gemv_only_under_auto_with_amx_and_when_measured_faster(tmp_path):
    gemm, dot = Calibration(2, 1), DotCalibration(fp32=1.0, bf16=2.0)
    pick = lambda flags, cal, requested="auto", weights=torch.bfloat16, kernels=True, **kw: cpu_choices(  # noqa: E731
        weights, CPU, requested, kernels=kernels, flags=flags, threads=2, measure=gemm, measure_dot=dot,
        measure_gemv=cal, **kw)
    fast, slow, refused = GemvCalibration(2.0, 1.0), GemvCalibration(1.0, 1.5), GemvCalibration(1.0)
    assert pick(SPR, fast).gemv_amx and "AMX tiles (calibrated: 2.00x" in pick(SPR, fast).describe()
    assert not pick(SPR, slow).gemv_amx and pick(SPR, slow).gemv_seconds == slow.t
    assert not pick(SPR, refused).gemv_amx          # the OS refused the tiles: the calibration ran dots only
    assert fast.dot == [False, False]               # against the dot tiles the bf16-dot choice runs
    never = GemvCalibration(2.0, 1.0)
    assert not pick(ZEN4, never).gemv_amx and not pick(AVX2, never).gemv_amx
    assert not pick(SPR, never, requested="float32").gemv_amx     # explicit: exact fp32 activations
    assert not pick(SPR, never, weights=torch.float16).gemv_amx
    assert not pick(SPR, never, kernels=False).gemv_amx
    assert never.calls == 0
    forced = pick(ZEN4, never, gemv="amx")
    assert forced.gemv_amx and forced.forced == ("decode_gemv",) and "(forced)" in forced.describe()
    assert not pick(SPR, fast, gemv="dots").gemv_amx and never.calls == 0
    cached = GemvCalibration(2.0, 1.0)
    for _ in range(2):
        assert pick(SPR, cached, cache=tmp_path).gemv_amx
    assert cached.calls == 1


def test_amx_gemv_calibration_runs_the_library_here():
    from freetoken.kernels import cpu_kernels
    from freetoken.kernels.choices import measure_amx_gemv
    lib = cpu_kernels()
    if lib is None:
        return
    t = measure_amx_gemv(1, n=256, k=512, tokens=(1, 3), reps=1, out_of_cache=1 << 20)
    assert set(t) == ({"dots", "amx"} if lib.ft_amx_ready() else {"dots"}) and all(v > 0 for v in t.values())


class AttCalibration:
    def __init__(self, **t):
        self.t, self.calls = t, 0

    def __call__(self, threads):
        self.calls += 1
        return dict(self.t)


def test_amx_attention_only_with_amx_when_a_verify_is_faster_and_a_plain_step_no_slower(tmp_path):
    pick = lambda flags, cal, weights=torch.bfloat16, kernels=True, **kw: cpu_choices(  # noqa: E731
        weights, CPU, "auto", kernels=kernels, flags=flags, threads=2, measure=Calibration(2, 1),
        measure_dot=DotCalibration(fp32=1.0, bf16=2.0), measure_gemv=GemvCalibration(1.0), measure_att=cal, **kw)
    fast = AttCalibration(**{"fp32-1": 1.0, "amx-1": 1.0, "fp32-9": 4.0, "amx-9": 2.0})
    assert pick(SPR, fast).att_amx and "attention on AMX tiles (calibrated: 1.00x / 2.00x" in pick(SPR, fast).describe()
    plain_loses = AttCalibration(**{"fp32-1": 1.0, "amx-1": 1.1, "fp32-9": 4.0, "amx-9": 2.0})
    assert not pick(SPR, plain_loses).att_amx       # a plain decode step must not pay for the verify's gain
    assert not pick(SPR, AttCalibration(**{"fp32-1": 1.0, "amx-1": 0.9, "fp32-9": 4.0, "amx-9": 4.5})).att_amx
    assert not pick(SPR, AttCalibration(**{"fp32-1": 1.0, "fp32-9": 4.0})).att_amx     # the OS refused the tiles
    never = AttCalibration(**fast.t)
    assert not pick(ZEN4, never).att_amx and not pick(SPR, never, weights=torch.float32).att_amx
    assert not pick(SPR, never, kernels=False).att_amx and never.calls == 0
    forced = pick(ZEN4, never, att="amx")
    assert forced.att_amx and forced.forced == ("decode_attention",) and "(forced)" in forced.describe()
    assert not pick(SPR, fast, att="fp32").att_amx and never.calls == 0
    cached = AttCalibration(**fast.t)
    for _ in range(2):
        assert pick(SPR, cached, cache=tmp_path).att_amx
    assert cached.calls == 1


def test_amx_attention_calibration_runs_the_library_here():
    from freetoken.kernels import cpu_kernels
    lib = cpu_kernels()
    if lib is None:
        return
    t = measure_att_amx(1, keys=300, reps=1, out_of_cache=1 << 20)
    modes = ("fp32", "amx") if lib.ft_amx_ready() else ("fp32",)
    assert set(t) == {f"{m}-{r}" for m in modes for r in (1, 9)} and all(v > 0 for v in t.values())


def test_ggml_k256_forced_by_numerics_calibrated_under_auto(tmp_path, monkeypatch):
    """ggml_numerics "q8k" forces the per-256 activations of the k-quant rows, the other explicit
    numerics keep theirs without measuring; "auto" follows the (cached) calibration."""
    def never(*a):
        raise AssertionError("measured")
    monkeypatch.setattr(choices, "K256_MARGIN", 0.97)       # the engine's margin (tests/conftest.py pins 0)
    for numerics, on in (("q8k", True), ("q8", False), ("llama", False), ("llama-exact", False), ("float32", False)):
        assert choices.ggml_k256_choice(numerics, "native", 2, measure=never, cache=tmp_path) is on
    for faster, on in (("q8k", True), ("q8", False)):
        times = {"q8": 2.0, "q8k": 2.0, faster: 1.0}
        assert choices.ggml_k256_choice("auto", "native", 2, measure=lambda *a: times, cache=tmp_path / faster) is on
        assert choices.ggml_k256_choice("auto", "native", 2, measure=never, cache=tmp_path / faster) is on   # cached


@pytest.mark.parametrize("isa", kernels.variants_here())
def test_ggml_k256_calibration_runs_the_library_here(isa):
    from freetoken.kernels.ggml_k256 import measure_k256
    t = measure_k256(1, isa, hidden=512, inter=256, reps=1, out_of_cache=1 << 20)
    assert set(t) == {"q8", "q8k"} and all(v > 0 for v in t.values())
    assert kernels.load(isa).ft_set_ggml_k256(-1) == 0          # the switch left as it was


def test_prefill_attention_on_the_fastest_of_torch_and_the_tiles_this_cpu_runs(tmp_path):
    pick = lambda flags, cal, weights=torch.bfloat16, kernels=True, **kw: cpu_choices(  # noqa: E731
        weights, CPU, "auto", kernels=kernels, flags=flags, threads=2, measure=Calibration(2, 1),
        measure_dot=DotCalibration(fp32=1.0, bf16=2.0), measure_gemv=GemvCalibration(1.0),
        measure_att=AttCalibration(**{"fp32-1": 1.0, "fp32-9": 4.0}), measure_patt=cal, **kw)
    fast = AttCalibration(torch=2.0, amx=1.0, vdpbf16ps=1.6)
    assert pick(SPR, fast).prefill_att == "amx"
    assert "prefill attention on AMX tiles (calibrated: 2.00x" in pick(SPR, fast).describe()
    assert pick(SPR, AttCalibration(torch=1.0, amx=1.5, vdpbf16ps=1.2)).prefill_att == "torch"
    assert pick(SPR, AttCalibration(torch=1.0)).prefill_att == "torch"     # neither kernel runs (no library bf16)
    zen = AttCalibration(torch=2.0, vdpbf16ps=0.8)      # no AMX: torch against vdpbf16ps
    assert pick(ZEN4, zen).prefill_att == "vdpbf16ps"
    assert "prefill attention vdpbf16ps tiles (calibrated: 2.50x" in pick(ZEN4, zen).describe()
    never = AttCalibration(**fast.t)
    assert pick(AVX2, never).prefill_att == "torch" and pick(SPR, never, weights=torch.float32).prefill_att == "torch"
    assert pick(SPR, never, kernels=False).prefill_att == "torch" and never.calls == 0
    for mode in ("amx", "vdpbf16ps"):
        forced = pick(AVX2, never, patt=mode)
        assert forced.prefill_att == mode and forced.forced == ("prefill_attention",) and "(forced)" in forced.describe()
    assert pick(SPR, fast, patt="torch").prefill_att == "torch" and never.calls == 0
    cached = AttCalibration(**fast.t)
    for _ in range(2):
        assert pick(SPR, cached, cache=tmp_path).prefill_att == "amx"
    assert cached.calls == 1


def test_prefill_attention_calibration_runs_the_library_here():
    from freetoken.kernels import cpu_kernels
    lib = cpu_kernels()
    if lib is None:
        return
    t = measure_prefill_att(1, tokens=96, reps=1)
    runs = {m for m, code in (("amx", 1), ("vdpbf16ps", 2)) if lib.ft_set_prefill_att(code)}
    lib.ft_set_prefill_att(0)
    assert set(t) == {"torch"} | runs and all(v > 0 for v in t.values())


@pytest.mark.parametrize("isa", kernels.variants_here())
def test_int8_zmm_forced_or_calibrated_where_the_build_has_it(isa, tmp_path):
    """int8_tiles ymm | zmm forces the int8 / mxfp4 tiles (zmm without AVX-512 in the build: a clear
    error); auto takes the faster of a (cached) calibration, never measured where zmm cannot run."""
    def never(*a):
        raise AssertionError("measured")
    lib = kernels.load(isa)
    runs = bool(lib.ft_set_int8_zmm(1))
    lib.ft_set_int8_zmm(0)
    assert runs == (isa == "native" and lib.ft_isa().decode().startswith("avx512"))
    assert choices.int8_zmm_choice(lib, isa, 2, measure=never, cache=tmp_path, forced="ymm") is False
    if not runs:
        with pytest.raises(InvalidRequestError):
            choices.int8_zmm_choice(lib, isa, 2, measure=never, cache=tmp_path, forced="zmm")
        assert choices.int8_zmm_choice(lib, isa, 2, measure=never, cache=tmp_path) is False
        return
    assert choices.int8_zmm_choice(lib, isa, 2, measure=never, cache=tmp_path, forced="zmm") is True
    for faster, on in (("zmm", True), ("ymm", False)):
        times = {"ymm": 2.0, "zmm": 2.0, faster: 1.0}
        assert choices.int8_zmm_choice(lib, isa, 2, measure=lambda *a: times, cache=tmp_path / faster) is on
        assert choices.int8_zmm_choice(lib, isa, 2, measure=never, cache=tmp_path / faster) is on     # cached
    assert lib.ft_set_int8_zmm(-1) == 0                 # the choice returns, the caller switches


@pytest.mark.parametrize("isa", kernels.variants_here())
def test_int8_tiles_calibration_runs_the_library_here(isa):
    from freetoken.kernels.int8_tiles import measure_int8_tiles
    lib = kernels.load(isa)
    t = measure_int8_tiles(1, isa, hidden=256, inter=64, tokens=8, reps=1)
    assert set(t) == {"ymm", "zmm"} and all(v > 0 for v in t.values())
    assert lib.ft_set_int8_zmm(-1) == 0                 # the switch left as it was
