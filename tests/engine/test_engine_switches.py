"""An engine's kernel choices are its own (kernels/switch_set.py): two engines of one process with
different forced choices, their steps interleaved or run from two threads, each give the prompt
logits and tokens it gives alone; building or stepping an engine leaves the process's switches
and what a raw kernel call computes as they were."""
from __future__ import annotations

import threading

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.kernels.pool import shared_pool
from freetoken.kernels.switch_set import SwitchSet
from freetoken.layers.linear import Linear

PROMPT = torch.randint(3, 400, (80,), generator=torch.Generator().manual_seed(38)).tolist()  # > 66: the prefill tiles
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
# bf16 dots and the prefill GEMM tiles on (vdpbf16ps, emulated where the build lacks it) against
# both off: every switch these set differs, and each changes the bits of a bf16 model's logits
DOTS_AND_TILES = {"bf16_dot": "on", "prefill_gemm": "vdpbf16ps"}
EXACT = {"bf16_dot": "off", "prefill_gemm": "float32"}


@pytest.fixture(scope="module")
def bf16_model(tiny_dir):
    return tiny_dir("qwen3_moe", dtype="bfloat16", layers=2, experts=4, top_k=2)


def engine(path, backend: str, choices: dict) -> LLM:
    return LLM(str(path), dtype="bfloat16", moe_backend=backend, num_threads=2, prefix_cache=False,
               speculative="off", **choices)


def start(llm: LLM, rid: str) -> None:
    llm.engine.add_request(rid, PROMPT, GREEDY, want_prompt_logits=True)


def collect(outs, got: dict) -> None:
    for o in outs:
        got.setdefault(o.request_id, [[], None])[0].extend(o.new_token_ids)
        if o.prompt_logits is not None:
            got[o.request_id][1] = o.prompt_logits


def alone(llm: LLM) -> tuple[list[int], torch.Tensor]:
    """(tokens, prompt logits) of PROMPT with this engine stepping by itself."""
    got: dict = {}
    start(llm, "alone")
    while llm.engine.has_unfinished():
        collect(llm.engine.step(), got)
    return got["alone"][0], got["alone"][1]


def interleaved(a: LLM, b: LLM) -> tuple[tuple, tuple]:
    """Both engines' runs of PROMPT, one step of each in turn (prefills, then decode steps)."""
    got: dict = {}
    start(a, "a")
    start(b, "b")
    while a.engine.has_unfinished() or b.engine.has_unfinished():
        for llm in (a, b):
            if llm.engine.has_unfinished():
                collect(llm.engine.step(), got)
    return tuple(got["a"]), tuple(got["b"])


def same(run, ref) -> bool:
    return run[0] == ref[0] and torch.equal(run[1], ref[1])


@pytest.mark.parametrize("backend", ["cpu", "resident"])     # C kernels; torch experts (the executors' records)
def test_two_engines_interleaving_steps_each_compute_as_alone(bf16_model, backend):
    a = engine(bf16_model, backend, DOTS_AND_TILES)
    a_alone = alone(a)
    b = engine(bf16_model, backend, EXACT)           # built after a ran: a's switches must not reach it
    b_alone = alone(b)
    assert not torch.equal(a_alone[1], b_alone[1])   # the choices change the bits: a mix-up would show
    ran_a, ran_b = interleaved(a, b)
    assert same(ran_a, a_alone) and same(ran_b, b_alone)
    assert same(alone(a), a_alone)                   # a's step after b was built and stepped
    a.close()
    b.close()


def test_two_engines_stepping_in_two_threads_each_compute_as_alone(bf16_model):
    a = engine(bf16_model, "cpu", DOTS_AND_TILES)
    refs = {"a": alone(a)}
    b = engine(bf16_model, "cpu", EXACT)
    refs["b"] = alone(b)
    got, errors = {}, []

    def run(name, llm):
        try:
            for i in range(3):
                got[name, i] = alone(llm)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(n, llm)) for n, llm in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(got) == 6
    assert all(same(run, refs[name]) for (name, _), run in got.items())
    a.close()
    b.close()


def raw_gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One row through the C kernels' bf16 GEMV, called directly (no engine)."""
    return Linear(w, None, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=shared_pool(2))(x)


def test_building_and_stepping_an_engine_leaves_the_process_switches(bf16_model):
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(96, 256, generator=g), torch.randn(1, 256, generator=g)
    exact = x.double() @ w.bfloat16().double().T      # fp32 activations: what the kernels compute as built
    before, raw_before = SwitchSet.now(), raw_gemv(x, w)
    assert ((raw_before.double() - exact).abs().max() / exact.abs().max()).item() < 1e-5
    llm = engine(bf16_model, "cpu", DOTS_AND_TILES)
    assert SwitchSet.now() == before and torch.equal(raw_gemv(x, w), raw_before)
    with llm.engine.model.kernel_switches.installed():  # the engine's own: the bf16 dots round x
        dots = raw_gemv(x, w)
    assert not torch.equal(dots, raw_before)
    llm.generate([PROMPT], GREEDY)
    assert SwitchSet.now() == before and torch.equal(raw_gemv(x, w), raw_before)
    llm.close()


def test_converting_a_checkpoint_leaves_the_process_switches(bf16_model, tmp_path):
    """`freetoken convert` builds the model as a load does, its calibrated choices in force meanwhile
    (where they differ from the as-built switches, e.g. the bf16 dots or the per-256 k-quants a
    calibration turns on, an unguarded build leaves them set): after it, the switches are as before."""
    from freetoken.loading.convert import convert
    shared_pool(2)                      # the kernels loaded: their switches are in the snapshot
    before = SwitchSet.now()
    convert(bf16_model, tmp_path / "m.ftw", num_threads=2)
    assert SwitchSet.now() == before


def test_a_model_built_outside_a_load_is_refused(bf16_model):
    """A model's choices go into the process only inside `loading()`: a build outside it would leave
    them behind for every later raw kernel call."""
    from freetoken.config import EngineConfig
    from freetoken.loading.loader import build_model
    from freetoken.weights.checkpoint import Checkpoint
    cfg = EngineConfig(model=str(bf16_model), dtype="bfloat16", device="cpu", moe_backend="cpu", num_threads=2)
    shared_pool(2)
    before = SwitchSet.now()
    with pytest.raises(RuntimeError, match="loading()"):
        build_model(Checkpoint(bf16_model), cfg, 64)
    assert SwitchSet.now() == before
