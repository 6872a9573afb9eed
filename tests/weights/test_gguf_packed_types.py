"""GGUFs in the ggml types added for issue 33 (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, TQ1_0, TQ2_0)
and a "dynamic mix" (gate, up and down of different types, the types changing from layer to
layer, dense layers mixed too, as unsloth's UD files have them) load packed: the expert pool is
the file's expert bytes (no float banks, no "dequantizing" warning), the dense layers stay in
their types, the disk tier / memory plan count the same bytes, an FTW from the file keeps them
(logits bit for bit), and the logits are those of the dequantized weights up to the int8
activation rounding of the kernels (dense layers checked exactly by test_gguf_dense's emulation)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from gguf_rewrite import rewrite
from helpers import exact_experts
from test_gguf_dense import check_packed, packed_layers
from test_gguf_mixed_widths import BACKENDS, _logits

from freetoken import LLM
from freetoken.cli import main as cli_main
from freetoken.memory.model_size import read_model_shape
from freetoken.quant import ggml_quants as gq
from freetoken.weights.gguf.reader import GgufFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_checks import ids_for  # noqa: E402

NEW = [gq.Q4_1, gq.Q5_0, gq.Q5_1, gq.IQ4_NL, gq.Q2_K, gq.Q3_K, gq.TQ1_0, gq.TQ2_0]


def _quantizable(name: str, shape: tuple) -> bool:
    return len(shape) >= 2 and shape[-1] % 256 == 0 and "norm" not in name and "ffn_gate_inp" not in name


def every_weight_in(t: int):
    return lambda name, shape: t if _quantizable(name, shape) else None


# expert (gate, up, down) per layer, as the dynamic mixes pick them: a 2-bit layer with a 3-bit
# down, gate and up in different types of one width (IQ4_NL and Q4_K: 4.5 bits; Q5_0 and Q5_K:
# 5.5 bits), a ternary layer
MIX_EXPERTS = [(gq.Q2_K, gq.Q2_K, gq.Q3_K), (gq.IQ4_NL, gq.Q4_K, gq.Q5_1), (gq.Q5_0, gq.Q5_K, gq.Q4_1),
               (gq.TQ1_0, gq.TQ1_0, gq.TQ2_0)]


def dynamic_mix(name: str, shape: tuple) -> int | None:
    """The experts as MIX_EXPERTS; the dense weights cycle through the new types by layer and part."""
    if not _quantizable(name, shape):
        return None
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    for i, p in enumerate(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")):
        if p in name:
            return MIX_EXPERTS[layer][i]
    part = next((i for i, p in enumerate(("attn_q.", "attn_k.", "attn_v.", "attn_output", "token_embd", "output."))
                 if p in name), 0)
    return NEW[(layer + part) % len(NEW)]


@pytest.fixture(scope="module")
def tiny_f32(tiny_dir, to_gguf):
    return to_gguf(tiny_dir("qwen3_moe", hidden=256, experts=4, moe_intermediate_size=256, layers=len(MIX_EXPERTS)),
                   "f32")


@pytest.fixture(scope="module")
def mix_gguf(tiny_f32, tmp_path_factory):
    return rewrite(tiny_f32, tmp_path_factory.mktemp("mix") / "mix.gguf", dynamic_mix)


def expert_file_bytes(ck) -> int:
    return sum(t.nbytes for n, (_, t) in ck.tensors_by_name.items() if "_exps." in n)


def check_pool(path: Path, caplog) -> None:
    """The pool holds the file's expert rows as they are: bytes (gate and up of a layer in their
    own widths, no padding), types, no float fallback."""
    ck = GgufFile(path)
    with caplog.at_level(logging.WARNING, logger="freetoken.weights"):
        pool = ck.prebuilt_experts()
    assert "dequantiz" not in caplog.text
    groups = getattr(pool, "groups", [pool])
    assert pool.spec.fmt == "ggml"
    type_ids = sum(g.banks[k].nbytes for g in groups for k in ("gate_up_types", "down_types"))
    assert pool.nbytes - type_ids == expert_file_bytes(ck)
    types = {t for g in groups for k in ("gate_up_types", "down_types") for t in g.banks[k].unique().tolist()}
    want = {t.ggml_type for n, (_, t) in ck.tensors_by_name.items() if "_exps." in n}
    assert types == want
    from freetoken.loading.disk_layout import gguf_layout
    layout = gguf_layout(ck)                           # the disk tier: the same bytes
    assert layout.nbytes == pool.nbytes and layout.expert_nbytes == pool.expert_nbytes
    shape = read_model_shape(path)                     # the memory plan too
    assert shape.prebuilt_pool_bytes == pool.nbytes and shape.prebuilt_expert_bytes == pool.expert_nbytes
    ck.close()


@pytest.mark.parametrize("t", NEW, ids=gq.type_name)
def test_each_type_loads_packed_with_the_dequantized_logits(t, tiny_f32, tmp_path, caplog, monkeypatch):
    """Every 2-D weight (experts, attention, embeddings, lm_head) in type t."""
    g = rewrite(tiny_f32, tmp_path / f"{gq.type_name(t)}.gguf", every_weight_in(t))
    check_pool(g, caplog)
    ids = ids_for(19, seed=t)
    with exact_experts():            # the float reference of the dequantized weights
        ref = LLM(str(g), dtype="float32", moe_backend="resident", dense_format="float").score(ids)
    llm = LLM(str(g), dtype="float32")                  # as served: C kernels for experts and dense layers
    n_packed, embed_packed = packed_layers(llm)
    assert n_packed >= 3 and embed_packed
    got = llm.score(ids)
    llm.close()
    scale = max(1.0, ref.abs().max().item())
    err = (got - ref).abs().max().item()
    print(f"{gq.type_name(t)}: packed vs dequantized float {err:.3g} (scale {scale:.3g})")
    # the int8 activation rounding through a random tiny model: 1-10% of the logit scale here
    # (measured with this test on Q8_0 0.010, Q4_K 0.015, the new types 0.009-0.10, Q2_K the
    # largest); a wrong decode would be O(1). The exact check is
    # layer by layer against the emulation of the rounding:
    assert err <= 0.2 * scale
    check_packed(g, ids, monkeypatch)


def test_dynamic_mix_loads_packed(mix_gguf, caplog):
    ck = GgufFile(mix_gguf)
    trio = [tuple(ck.tensor_info(f"blk.{b}.ffn_{p}_exps.weight").ggml_type for p in ("gate", "up", "down"))
            for b in range(len(MIX_EXPERTS))]
    assert trio == MIX_EXPERTS
    check_pool(mix_gguf, caplog)          # pool bytes == the file's expert bytes (+ type ids)
    llm = LLM(str(mix_gguf), dtype="float32")
    items = {i.name: i for i in llm.engine.memory_plan.items}
    assert items["expert pool"].nbytes == llm.engine.model.pool.nbytes
    assert packed_layers(llm)[0] >= 3
    llm.close()


def test_dynamic_mix_dense_layers_match_their_emulation(mix_gguf, monkeypatch):
    check_packed(mix_gguf, ids_for(23, seed=6), monkeypatch)


@pytest.mark.parametrize("backend,slots", BACKENDS, ids=[f"{b}-{s}" for b, s in BACKENDS])
def test_dynamic_mix_backends_match_the_padded_pool(mix_gguf, monkeypatch, backend, slots):
    """Each backend on the grouped pool (a group per row widths) gives its logits on one bank
    padded to the widest rows."""
    opts = dict(moe_backend=backend, **({"expert_cache_slots": slots} if slots else {}))
    got = _logits(mix_gguf, False, monkeypatch, **opts)
    want = _logits(mix_gguf, True, monkeypatch, **opts)
    if backend == "hybrid":
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    else:
        assert torch.equal(got, want)


def test_dynamic_mix_disk_tier_is_bit_exact(mix_gguf):
    """The disk tier reads each layer's rows in their own widths from the file: the fully
    resident pool's logits, bit for bit, and each expert counted at its own bytes."""
    ids = ids_for(17, seed=2)
    ref = LLM(str(mix_gguf), dtype="float32")
    want = ref.score(ids)
    pool = ref.engine.model.pool
    real = [pool.groups[g].expert_nbytes for g, _ in map(pool.layer_group, range(pool.num_layers))]
    ref.close()
    llm = LLM(str(mix_gguf), dtype="float32", host_cache_slots=3)
    assert llm.engine.settings.expert_tier == "disk"
    assert torch.equal(llm.score(ids), want)
    st = llm.expert_stats()
    llm.close()
    assert st["total"]["cpu_bytes"] == sum(row["cpu_experts"] * real[m] for m, row in enumerate(st["per_layer"])) > 0


def test_dynamic_mix_to_ftw_keeps_bytes_and_logits(mix_gguf, tmp_path):
    out = tmp_path / "mix.ftw"
    assert cli_main(["convert", "--model", str(mix_gguf), "--out", str(out)]) == 0
    direct, ftw = LLM(str(mix_gguf), dtype="float32"), LLM(str(out), dtype="float32")
    want, got = direct.engine.model.pool, ftw.engine.model.pool
    assert got.nbytes == want.nbytes
    for wg, gg in zip(getattr(want, "groups", [want]), getattr(got, "groups", [got])):
        for name, bank in wg.banks.items():
            assert torch.equal(gg.banks[name], bank), name
    ids = ids_for(23, seed=3)
    assert torch.equal(ftw.score(ids), direct.score(ids))
    direct.close()
    ftw.close()
