"""A dynamic mix whose gate and up differ in row width in every layer (and the layers from each
other: unsloth-style), issue 33 item 2: the host pool, the disk tier and the memory plan hold
the file's expert bytes exactly (gate and up are banks of their own: no half pads to the other),
and the logits are those of the same model in F32 holding the values gguf.quants decodes the
blocks to (the independent reference), on the C kernels (each ISA build this CPU runs), the
torch slots of the device path and the disk tier."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.experts.execution import torch_exec
from freetoken.kernels import variants_here
from freetoken.loading.disk_layout import gguf_layout
from freetoken.memory.model_size import read_model_shape
from freetoken.quant import ggml_quants as gq
from freetoken.weights.gguf.reader import GgufFile
from test_gguf_device_types import _equal, _near, _run
from test_gguf_iquants import write_pair
from helpers import exact_experts
from model_checks import ids_for

# per layer (gate, up, down): gate and up of different row widths (84 vs 144, 272 vs 144, 110 vs
# 176 bytes per 256), every layer in other types
LAYERS = [(gq.Q2_K, gq.Q4_K, gq.Q6_K), (gq.Q8_0, gq.Q4_0, gq.Q3_K), (gq.Q3_K, gq.Q5_K, gq.Q4_0)]
PARTS = ("gate", "up", "down")


def write_mix(src: Path, dst: Path, ref: Path) -> None:
    """dst: src with blk.N.ffn_{gate,up,down}_exps in LAYERS[N] (the float values quantized);
    ref: the same model in F32 holding what those blocks dequantize to (by gguf.quants)."""
    def blocks(name, shape, t):
        part = next((i for i, p in enumerate(PARTS) if f".ffn_{p}_exps." in name), None)
        if part is None:
            return None
        want = LAYERS[int(name.split(".")[1])][part]
        x = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
        return gq.quantize(x.reshape(-1, shape[-1]), want).numpy(), want

    write_pair(src, dst, ref, blocks)


@pytest.fixture(scope="module")
def mix(tiny_dir, to_gguf, tmp_path_factory):
    d = tiny_dir("qwen3_moe", hidden=256, experts=4, moe_intermediate_size=256, layers=len(LAYERS))
    root = tmp_path_factory.mktemp("gate_up_widths")
    q, ref = root / "mix.gguf", root / "ref.gguf"
    write_mix(to_gguf(d, "f32"), q, ref)
    return q, ref


def _served(path, **opts):
    """(prompt logits, greedy decode logits, tokens, the experts backend's class name)."""
    llm = LLM(str(path), dtype="float32", **opts)
    try:
        prompt, seen = ids_for(19, seed=3), []
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                logits_processors=[lambda ids, lg: seen.append(lg.clone()) or lg])
        out = llm.generate([prompt], params)[0].token_ids
        return llm.score(prompt + out), torch.stack(seen), out, type(llm.engine.model.experts).__name__
    finally:
        llm.close()


@pytest.fixture(scope="module")
def references(mix):
    """(exact, int8): the F32 model's logits with exact expert activations, and with them rounded
    to int8 per 32 as the C kernels round them (the torch executor on the float banks)."""
    _, ref = mix
    with exact_experts():
        exact = _run(ref, moe_backend="resident")
    saved = torch_exec.default_rounding
    torch_exec.default_rounding = lambda banks, spec, dtype, tokens=1: "int8x32"
    try:
        int8 = _run(ref, moe_backend="resident")
    finally:
        torch_exec.default_rounding = saved
    return exact, int8


def test_pool_is_the_files_expert_bytes(mix):
    q, _ = mix
    ck = GgufFile(q)
    pool = ck.prebuilt_experts()
    tensors = {n: t for n, (_, t) in ck.tensors_by_name.items()}
    in_file = sum(t.nbytes for n, t in tensors.items() if "_exps." in n)
    type_ids = sum(g.banks[k].nbytes for g in pool.groups for k in ("gate_up_types", "down_types"))
    assert type_ids == 12 * pool.num_layers * pool.num_experts
    assert pool.nbytes == in_file + type_ids
    assert len(pool.groups) == len(LAYERS)
    for m, trio in enumerate(LAYERS):                 # each bank in its own type's row width
        group, _ = pool.layer_group(m)
        banks = pool.groups[group].banks
        for part, t, cols in zip(PARTS, trio, (256, 256, 256)):
            assert banks[part].shape[-1] == gq.row_bytes(t, cols), (m, part)
    assert gguf_layout(ck).nbytes == pool.nbytes      # the disk tier reads the same bytes
    assert read_model_shape(q).prebuilt_pool_bytes == pool.nbytes    # and the memory plan counts them


@pytest.mark.parametrize("isa", ["native", "avx2", "portable"])
def test_c_kernels_give_the_float_models_logits(mix, references, isa):
    if isa not in variants_here():
        pytest.skip(f"the {isa} kernel build does not run on this CPU")
    q, _ = mix
    _, (want_scored, _, want_out, _, _) = references
    scored, seen, out, _ = _served(q, moe_backend="cpu", kernel_isa=isa)
    _near(scored, want_scored, f"prompt {isa}")
    if out == want_out:
        _near(seen, want_scored[18:18 + len(seen)], f"decode {isa}")


def test_device_path_gives_the_float_models_logits(mix, references, monkeypatch):
    """offload with the decisions on the device (forced on the CPU): the torch slots of gate and
    up in their own widths, exact activations against the exact float model."""
    q, _ = mix
    (want_scored, want_seen, want_out, _, _), _ = references
    pool = GgufFile(q).prebuilt_experts()
    with exact_experts():
        scored, seen, out, cached, backend = _run(q, monkeypatch, moe_backend="offload", expert_cache_policy="lru",
                                                  expert_cache_slots=pool.num_layers * pool.num_experts)
    assert backend._devpath is not None
    assert cached == pool.nbytes - 12 * pool.num_layers * pool.num_experts   # the slots hold the file's bytes
    assert out == want_out
    _equal(scored, want_scored, "prompt")
    _equal(seen, want_seen, "decode")


def test_disk_tier_gives_the_float_models_logits(mix, references):
    """The disk tier (host cache of 3 slots: experts read from the file per piece at their own
    widths, run by the C kernels)."""
    q, _ = mix
    _, (want_scored, _, want_out, _, _) = references
    scored, seen, out, backend = _served(q, host_cache_slots=3)
    assert backend == "DiskExperts", backend
    _near(scored, want_scored, "prompt disk")
    if out == want_out:
        _near(seen, want_scored[18:18 + len(seen)], "decode disk")
