"""GGUFs whose weights are llama.cpp's lattice i-quants (IQ1_S .. IQ3_S), written with
gguf.GGUFWriter: experts and dense layers load packed (no dequantize-to-float fallback), the
expert pool holds exactly the file's expert bytes, and the logits are those of a float GGUF
holding the same dequantized weights (exactly on the torch path, to the int8-activation
tolerance on the C kernels)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from freetoken import LLM
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq
from freetoken.weights.gguf.reader import GgufFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from helpers import assert_logits_close, exact_experts  # noqa: E402
from model_checks import ids_for  # noqa: E402
from test_gguf_dense import packed_layers  # noqa: E402

T = gguf.GGUFValueType


def _copy_keys(reader, w):
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        v = field.contents()
        if field.types[0] == T.ARRAY:
            w.add_key_value(key, v, T.ARRAY, sub_type=field.types[-1])
        else:
            w.add_key_value(key, v, field.types[0])


def unit_d(t: int) -> float:
    """The d that gives random blocks of type t weights of rms 0.5 (a stable random model)."""
    v = gq.dequantize(iq.random_rows(t, 64, 256, torch.Generator().manual_seed(0), scale=1.0), t, 256)
    return 0.5 / float(v.pow(2).mean().sqrt())


def write_pair(src: Path, dst: Path, ref: Path, blocks) -> None:
    """dst: src with each tensor for which blocks(name, shape, tensor) gives (raw blocks, ggml type)
    holding those blocks; ref: the same model in F32, holding the values the blocks dequantize to
    (by gguf.quants, the independent reference). blocks -> None keeps a tensor as it is in both."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    wq, wf = gguf.GGUFWriter(dst, arch), gguf.GGUFWriter(ref, arch)
    _copy_keys(reader, wq)
    _copy_keys(reader, wf)
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        made = blocks(t.name, shape, t)
        if made is None:
            for w in (wq, wf):
                w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
            continue
        raw, want = made
        vals = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(want)), dtype=np.float32)
        wq.add_tensor(t.name, raw.reshape(*shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType(want))
        wf.add_tensor(t.name, vals.reshape(shape), raw_dtype=gguf.GGMLQuantizationType.F32)
    for w in (wq, wf):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def write_iq(src: Path, dst: Path, ref: Path, type_of, seed: int = 0) -> None:
    """write_pair with every tensor type_of(name, shape) names replaced by random valid blocks of
    that i-quant (d scaled to the tensor's size)."""
    gen = torch.Generator().manual_seed(seed)

    def blocks(name, shape, t):
        want = type_of(name, shape)
        if want is None:
            return None
        rows = int(np.prod(shape[:-1]))
        return iq.random_rows(want, rows, shape[-1], gen, scale=unit_d(want) / shape[-1] ** 0.5).numpy(), want

    write_pair(src, dst, ref, blocks)


def quantizable(name: str, shape: tuple) -> bool:
    return not (len(shape) < 2 or shape[-1] % 256 or "norm" in name or "ffn_gate_inp" in name
                or name.endswith(".bias") or name.startswith("token_embd"))


@pytest.fixture(scope="module")
def f32_gguf(tiny_dir, to_gguf):
    d = tiny_dir("qwen3_moe", hidden=256, experts=4, moe_intermediate_size=256, layers=2)
    return to_gguf(d, "f32")


def check_file(q: Path, ref: Path, caplog):
    ck = GgufFile(q)
    with caplog.at_level(logging.WARNING):
        pool = ck.prebuilt_experts()
    assert "dequantiz" not in caplog.text
    in_file = sum(t.nbytes for n, (_, t) in ck.tensors_by_name.items() if "_exps." in n)
    type_ids = sum(g.banks[k].nbytes for g in pool.groups for k in ("gate_up_types", "down_types"))
    assert pool.nbytes - type_ids == in_file                      # the file's expert bytes, packed
    from freetoken.memory.model_size import read_model_shape
    from freetoken.loading.disk_layout import gguf_layout
    layout = gguf_layout(ck)                  # the disk tier and the memory plan count the same bytes
    assert layout.nbytes == pool.nbytes and layout.expert_nbytes == pool.expert_nbytes
    assert read_model_shape(q).prebuilt_pool_bytes == pool.nbytes
    ids = ids_for(23, seed=3)
    ref_llm = LLM(str(ref), dtype="float32")
    want = ref_llm.score(ids)
    ref_llm.close()
    with exact_experts():      # torch experts and dequantized dense layers: the float model exactly
        llm = LLM(str(q), dtype="float32", moe_backend="resident", dense_format="float")
        assert_logits_close(llm.score(ids), want)
        llm.close()
    llm = LLM(str(q), dtype="float32")                            # as served: packed, C kernels
    n_packed, _ = packed_layers(llm)
    assert n_packed >= 2 * 2, "dense i-quant layers were not kept packed"    # q|k|v and o per layer
    got = llm.score(ids)
    llm.close()
    # int8 activations per 32 (llama.cpp's; the kernels equal a float64 product with them: see
    # tests/layers/test_ggml_linear_iq.py): the median position within 3% of the logit scale,
    # later ones further once the rounding flipped a router near-tie (docs/gguf.md; measured:
    # IQ2_S 17 of 23 positions <= 1.8%, the worst 14.8%), the top-1 token kept
    scale = max(1.0, want.abs().max().item())
    per_pos = (got - want).abs().amax(-1) / scale
    assert per_pos.median().item() <= 3e-2 and per_pos.max().item() <= 0.25, per_pos
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree


@pytest.mark.parametrize("t", iq.TYPES, ids=gq.type_name)
def test_each_i_quant_loads_packed(f32_gguf, tmp_path, caplog, t):
    q, ref = tmp_path / "q.gguf", tmp_path / "ref.gguf"
    write_iq(f32_gguf, q, ref, lambda n, s: t if quantizable(n, s) else None, seed=t)
    check_file(q, ref, caplog)


def mix_type(name, shape):
    """Types per tensor kind and layer, as a dynamic mix picks them (gate and up alike)."""
    if not quantizable(name, shape):
        return None
    order = [iq.IQ1_S, iq.IQ2_XXS, iq.IQ3_XXS, iq.IQ1_M, iq.IQ2_S, iq.IQ3_S, iq.IQ2_XS]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    kind = ["ffn_gate_exps", "ffn_down_exps", "attn_q", "attn_k", "attn_v", "attn_output"]
    name = name.replace("ffn_up_exps", "ffn_gate_exps")
    k = next((i for i, p in enumerate(kind) if f".{p}." in name), 0)
    return order[(k + 3 * layer) % len(order)]


@pytest.mark.parametrize("isa", ["native", "avx2", "portable"])
def test_ftw_keeps_the_i_quant_bytes(f32_gguf, tmp_path, isa):
    """`freetoken convert` of an i-quant mix: the FTW file gives the GGUF's logits bit for bit,
    on every kernel build."""
    from freetoken.cli import main as cli_main
    from freetoken.kernels import variants_here
    if isa not in variants_here():
        pytest.skip(f"the {isa} kernel build does not run on this CPU")
    q, ref, out = tmp_path / "q.gguf", tmp_path / "ref.gguf", tmp_path / "q.ftw"
    write_iq(f32_gguf, q, ref, mix_type, seed=7)
    assert cli_main(["convert", "--model", str(q), "--out", str(out)]) == 0
    ids = ids_for(23, seed=3)
    direct = LLM(str(q), dtype="float32", kernel_isa=isa)
    want = direct.score(ids)
    direct.close()
    ftw = LLM(str(out), dtype="float32", kernel_isa=isa)
    assert torch.equal(ftw.score(ids), want)
    ftw.close()


def test_dynamic_mix_of_i_quants(f32_gguf, tmp_path, caplog):
    """UD-IQ1_S-like: down and the layers in different i-quants from gate / up, attention in
    others; pool bytes still the file's. (Gate and up of one layer share a type here, as in
    llama.cpp's mixes; test_gguf_device_types.py's mix gives them different widths.)"""
    q, ref = tmp_path / "q.gguf", tmp_path / "ref.gguf"
    write_iq(f32_gguf, q, ref, mix_type, seed=99)
    check_file(q, ref, caplog)
