"""Every ggml type, and a dynamic mix, through the device path (issue 33, items 2 and 4): tiny
MoE GGUFs written with gguf.GGUFWriter whose experts are in one type each (or gate, up, down and
the layers all in different types), served with `offload` and the decisions on the "device"
(forced on the CPU: the same torch code a GPU runs). The cache slots hold the file's bytes, never
a float copy, and the logits are those of the CPU C kernels on the same file."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.experts.execution import tiered
from freetoken.loading import experts_backend
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq
from freetoken.weights.gguf.reader import GgufFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from helpers import exact_experts  # noqa: E402
from model_checks import ids_for  # noqa: E402
from test_gguf_iquants import _copy_keys, unit_d  # noqa: E402

TYPES = [t for t in gq.NAMES if t not in gq.FLOAT_TYPES]
L = 3


def write_experts(src: Path, dst: Path, type_of, seed: int = 0) -> Path:
    """dst: src with each `*_exps` tensor in type_of(name) (None: kept): the float values
    quantized (round to nearest), i-quants random valid blocks of the tensor's scale."""
    gen = torch.Generator().manual_seed(seed)
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    _copy_keys(reader, w)
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        want = type_of(t.name) if "_exps." in t.name else None
        if want is None:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
            continue
        rows = int(np.prod(shape[:-1]))
        if want in iq.TYPES:
            raw = iq.random_rows(want, rows, shape[-1], gen, scale=unit_d(want) / shape[-1] ** 0.5)
        else:
            x = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
            raw = gq.quantize(x.reshape(rows, shape[-1]), want)
        w.add_tensor(t.name, raw.numpy().reshape(*shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType(want))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def f32_gguf(tiny_dir, to_gguf):
    d = tiny_dir("qwen3_moe", hidden=256, experts=4, moe_intermediate_size=256, layers=L)
    return to_gguf(d, "f32")


def mix_type(name: str) -> int:
    """A dynamic mix: gate, up and down of a layer in different types and row widths (gate and
    up too), the layers different from each other, 1- to 8-bit."""
    layer = int(name.split(".")[1])
    kinds = {"ffn_gate_exps": (gq.Q2_K, iq.IQ3_XXS, iq.IQ1_M), "ffn_up_exps": (gq.Q3_K, iq.IQ3_S, gq.TQ1_0),
             "ffn_down_exps": (gq.Q6_K, gq.Q4_K, iq.IQ2_XXS)}
    return next(v[layer % 3] for k, v in kinds.items() if f".{k}." in name)


def _offload_on_device(monkeypatch):
    """`offload` with its decisions on the device (the engine picks that on CUDA)."""
    monkeypatch.setattr(experts_backend, "TieredExperts", functools.partial(tiered.TieredExperts, device_decisions=True))


def _run(path, monkeypatch=None, **opts):
    """(prompt logits, greedy decode logits, tokens, the experts backend's cache or None)."""
    if monkeypatch is not None:
        _offload_on_device(monkeypatch)
    # q8: int8 per 32 in the C kernels as on the device path ("auto" may take per-256 k-quant rows
    # where its calibration measures them faster: that engine's own choice)
    llm = LLM(str(path), dtype="float32", ggml_numerics="q8", **opts)
    try:
        prompt = ids_for(19, seed=3)
        seen = []
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                logits_processors=[lambda ids, lg: seen.append(lg.clone()) or lg])
        out = llm.generate([prompt], params)[0].token_ids
        scored = llm.score(prompt + out)
        backend = llm.engine.model.experts
        cache = getattr(backend, "cache", None)
        check = None if cache is None else _cache_holds_file_bytes(cache, path)
        return scored, torch.stack(seen), out, check, backend
    finally:
        llm.close()
        if monkeypatch is not None:
            monkeypatch.undo()


def _cache_holds_file_bytes(cache, path) -> int:
    """Every resident slot's rows begin with its expert's bytes as the file has them (the rest of
    a slot row is the widest type's room); returns the resident experts' own bytes."""
    ck = GgufFile(path)
    tensors = {n: t for n, (_, t) in ck.tensors_by_name.items()}
    E = cache.pool.num_experts
    total = 0
    for slot, fid in enumerate(cache.owner.tolist()):
        if fid < 0:
            continue
        m, e = divmod(fid, E)
        for bank in ("gate", "up", "down"):
            t = tensors[f"blk.{m}.ffn_{bank}_exps.weight"]
            raw = torch.from_numpy(np.array(ck.raw(t.name))).reshape(t.shape[0], t.shape[1], -1)[e]
            got = cache.banks[bank][slot]
            assert torch.equal(got[:, :raw.shape[-1]].cpu(), raw), (slot, fid, bank)
            total += raw.numel()
    return total


def _near(got, want, what):
    """Both round activations to int8 per 32 (llama.cpp's); the torch path sums in another
    float32 order, so an intermediate at a rounding near-tie may flip one int8 step, and through
    attention that moves every later position a little (measured: the first positions equal to
    1e-7, later ones 2e-5..9e-4 of the logit scale after a flip, decode up to 3.3e-3; a flip in
    the prompt moves every decode position: IQ1_S's pair loop, 2e-7 from float64 like the
    256-bit loop's 1.3e-7, flips one there and its decode median is 2.2e-3)."""
    scale = max(1.0, want.abs().max().item())
    per_pos = (got - want).abs().amax(-1) / scale
    assert per_pos.median().item() <= 4e-3 and per_pos.max().item() <= 2e-2, (what, per_pos)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.9, what


def _equal(got, want, what):
    """Exact activations on both sides: float32 summation order only."""
    scale = max(1.0, want.abs().max().item())
    err = (got - want).abs().max().item() / scale
    assert err <= 1e-5, (what, err)


def check_types(path, monkeypatch):
    ck = GgufFile(path)
    pool = ck.prebuilt_experts()
    in_file = sum(t.nbytes for n, (_, t) in ck.tensors_by_name.items() if "_exps." in n)
    type_ids = sum(g.banks[k].nbytes for g in pool.groups for k in ("gate_up_types", "down_types"))
    device = dict(moe_backend="offload", expert_cache_policy="lru", expert_cache_slots=pool.num_layers * pool.num_experts)
    want_scored, _, want_out, _, _ = _run(path)                            # the CPU C kernels
    got_scored, got_seen, got_out, cached, backend = _run(path, monkeypatch, **device)
    assert backend._devpath is not None, "the device decisions did not run"
    _near(got_scored, want_scored, "prompt")
    if got_out == want_out:          # decode logits vs the C kernels' on the same tokens
        _near(got_seen, want_scored[18:18 + len(got_seen)], "decode")
    assert cached == in_file        # all experts resident: the cache holds the file's expert bytes
    slot = sum(b[0].nbytes for b in backend.cache.banks.values())
    assert slot == pool.expert_nbytes       # a slot: each bank's widest group (the pool's figure)
    assert backend.cache_size()["bytes"] == backend.cache.capacity * slot     # what the device plan sizes by
    with exact_experts():           # vs the per-expert torch executor on the host pool, exactly
        exact_scored, exact_seen, exact_out, _, _ = _run(path, monkeypatch, **device)
        ref_scored, ref_seen, ref_out, _, _ = _run(path, moe_backend="resident")
    assert exact_out == ref_out
    _equal(exact_scored, ref_scored, "prompt")
    _equal(exact_seen, ref_seen, "decode")
    return pool.nbytes - type_ids, in_file


@pytest.mark.parametrize("t", TYPES, ids=gq.type_name)
def test_each_type_on_the_device_path(f32_gguf, tmp_path, monkeypatch, t):
    q = write_experts(f32_gguf, tmp_path / "q.gguf", lambda name: t, seed=t)
    pool_bytes, in_file = check_types(q, monkeypatch)
    assert pool_bytes == in_file


def test_dynamic_mix_on_the_device_path(f32_gguf, tmp_path, monkeypatch):
    q = write_experts(f32_gguf, tmp_path / "mix.gguf", mix_type, seed=5)
    check_types(q, monkeypatch)


def test_mix_counts_each_types_bytes_in_every_tier(f32_gguf, tmp_path):
    """The dynamic mix: the host pool, the memory plan, the disk tier and the FTW file count the
    same bytes: the file's expert bytes (one pool per row widths, gate and up banks of their own
    widths, no padding) plus the type ids."""
    from freetoken.cli import main as cli_main
    from freetoken.loading.disk_layout import gguf_layout
    from freetoken.memory.model_size import read_model_shape
    from freetoken.memory.plan import expert_nbytes
    from freetoken.weights.source import open_checkpoint
    q, ftw = write_experts(f32_gguf, tmp_path / "mix.gguf", mix_type, seed=5), tmp_path / "mix.ftw"
    ck = GgufFile(q)
    pool = ck.prebuilt_experts()
    tensors = {n: t for n, (_, t) in ck.tensors_by_name.items()}
    in_file = sum(t.nbytes for n, t in tensors.items() if "_exps." in n)
    type_ids = sum(g.banks[k].nbytes for g in pool.groups for k in ("gate_up_types", "down_types"))
    assert all(tensors[f"blk.{m}.ffn_gate_exps.weight"].nbytes != tensors[f"blk.{m}.ffn_up_exps.weight"].nbytes
               for m in range(L))                    # gate and up differ in row width in every layer
    assert pool.nbytes - type_ids == in_file
    assert len(pool.groups) == L                         # three layers, three row widths: no padding between them
    layout = gguf_layout(ck)       # the disk tier reads each piece at its own width: the file's bytes
    assert layout.nbytes == in_file + type_ids and layout.expert_nbytes == pool.expert_nbytes
    shape = read_model_shape(q)
    assert shape.prebuilt_pool_bytes == pool.nbytes and expert_nbytes(shape, "ggml") == pool.expert_nbytes
    assert cli_main(["convert", "--model", str(q), "--out", str(ftw)]) == 0
    assert read_model_shape(ftw).prebuilt_pool_bytes == pool.nbytes
    llm = LLM(str(q), dtype="float32", moe_backend="offload", expert_cache_slots=4)
    try:                            # the device tier's plan: a slot as the cache allocates it
        items = {i.name: i for i in llm.engine.memory_plan.items}
        cache = llm.engine.model.experts.cache
        assert items["expert cache"].nbytes == 4 * pool.expert_nbytes == sum(b.nbytes for b in cache.banks.values())
        assert items["expert pool"].nbytes == pool.nbytes
    finally:
        llm.close()
    fpool = open_checkpoint(ftw).prebuilt_experts()
    assert fpool.nbytes == pool.nbytes
    for a, b in zip(pool.groups, fpool.groups):
        assert all(torch.equal(a.banks[k], b.banks[k]) for k in a.banks)
