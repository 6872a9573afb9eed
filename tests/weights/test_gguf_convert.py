"""`freetoken convert --model FILE.gguf --out FILE.ftw`: the FTW file keeps every GGUF tensor
as the file has it (the same bytes and types, dense rows too), carries its tokenizer and chat
template, is the GGUF's size, and gives the logits of loading the GGUF directly, bit for bit,
with the GGUF's dense rows kept packed or dequantized alike."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf_rewrite import q4_k_m, rewrite

from freetoken import LLM
from freetoken.cli import main as cli_main
from freetoken.quant import ggml_quants
from freetoken.weights.ftw.reader import read_header

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_checks import ids_for  # noqa: E402


@pytest.fixture(scope="module")
def q4_k_m_gguf(tiny_dir, to_gguf, tmp_path_factory):
    d = tiny_dir("qwen3_moe", hidden=256, experts=4, moe_intermediate_size=256, layers=3)
    return rewrite(to_gguf(d, "f32"), tmp_path_factory.mktemp("q4km") / "m.gguf", q4_k_m)


@pytest.mark.parametrize("source", ["q4_k_m", "q8_0-glm4_moe", "bf16-deepseek_v3"])
def test_gguf_to_ftw_keeps_experts_packed_and_logits(request, tiny_dir, to_gguf, tmp_path, source):
    if source == "q4_k_m":
        g = request.getfixturevalue("q4_k_m_gguf")
    else:
        outtype, arch = source.split("-")
        g = to_gguf(tiny_dir(arch, **({"scoring_func": "sigmoid"} if arch == "deepseek_v3" else {})), outtype)
    out = tmp_path / "m.ftw"
    assert cli_main(["convert", "--model", str(g), "--out", str(out)]) == 0
    assert out.stat().st_size <= 1.02 * g.stat().st_size + (1 << 20)     # + the tokenizer side files
    header = read_header(out)
    assert {t["kind"] for t in header["tensors"]} == {"ggml", "file"}
    direct, ftw = LLM(str(g), dtype="float32"), LLM(str(out), dtype="float32")
    want, got = direct.engine.model.pool, ftw.engine.model.pool
    assert got.spec == want.spec
    assert len(got.groups) == len(want.groups) and got.layer_group(0) == want.layer_group(0)
    for wg, gg in zip(want.groups, got.groups):       # a Q4_K_M pool: one group per row width
        for name, bank in wg.banks.items():
            assert gg.banks[name].dtype == bank.dtype and torch.equal(gg.banks[name], bank), name
    if source != "bf16-deepseek_v3":
        assert want.spec.fmt == "ggml"
        assert set(got.groups[0].banks) == {"gate", "up", "gate_up_types", "down", "down_types"}
    if source == "q4_k_m":
        assert {ggml_quants.Q4_K, ggml_quants.Q6_K} <= {t for g in got.groups
                                                        for t in g.banks["down_types"].unique().tolist()}
    ids = ids_for(23, seed=3)
    assert torch.equal(ftw.score(ids), direct.score(ids))
    floats = [LLM(str(m), dtype="float32", dense_format="float") for m in (g, out)]   # dense rows dequantized
    assert torch.equal(floats[1].score(ids), floats[0].score(ids))
    text = "hello <think> 世界"
    assert ftw.tokenizer.encode(text) == direct.tokenizer.encode(text)
    assert ftw.tokenizer.chat_template == direct.tokenizer.chat_template
    assert ftw.tokenizer.eos_token_ids == direct.tokenizer.eos_token_ids
    assert header["source"] == g.name and {"tokenizer.json", "tokenizer_config.json"} <= \
        {t["name"] for t in header["tensors"] if t["kind"] == "file"}


@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_gguf_and_its_ftw_agree_bit_for_bit_on_every_kernel_build(q4_k_m_gguf, tmp_path, isa):
    """The ggml experts and dense kernels of the other builds (the native one runs above): the
    FTW file still gives the GGUF's logits exactly."""
    from freetoken.kernels import variants_here
    if isa not in variants_here():
        pytest.skip(f"the {isa} kernel build does not run on this CPU (here: {', '.join(variants_here())})")
    out = tmp_path / "m.ftw"
    assert cli_main(["convert", "--model", str(q4_k_m_gguf), "--out", str(out)]) == 0
    direct = LLM(str(q4_k_m_gguf), dtype="float32", kernel_isa=isa)
    ftw = LLM(str(out), dtype="float32", kernel_isa=isa)
    assert direct.engine.model.choices.kernels == ftw.engine.model.choices.kernels == isa
    ids = ids_for(23, seed=3)
    assert torch.equal(ftw.score(ids), direct.score(ids))


def test_expert_format_on_quantized_gguf_is_refused(q4_k_m_gguf, tmp_path, capsys):
    args = ["convert", "--model", str(q4_k_m_gguf), "--out", str(tmp_path / "m.ftw"), "--expert-format", "int8"]
    assert cli_main(args) != 0
    assert "m.gguf: a GGUF converts with its tensors as they are; pass --expert-format int8 to `freetoken serve`" \
        in capsys.readouterr().err
    assert not (tmp_path / "m.ftw").exists()


def test_gguf_in_ftw_damaged_tensor_is_named(q4_k_m_gguf, tmp_path):
    """A byte flipped inside a GGUF tensor of the FTW file: the load stops with the tensor's
    name (its checksum is verified as it is read); with verify_weights off it loads."""
    from freetoken.errors import CheckpointError
    out = tmp_path / "m.ftw"
    assert cli_main(["convert", "--model", str(q4_k_m_gguf), "--out", str(out)]) == 0
    t = next(t for t in read_header(out)["tensors"] if t["name"] == "blk.1.ffn_down_exps.weight")
    with open(out, "r+b") as f:
        f.seek(t["offset"] + t["nbytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(CheckpointError, match=r"m\.ftw: checksum mismatch in tensor 'blk\.1\.ffn_down_exps\.weight'"):
        LLM(str(out), dtype="float32")
    LLM(str(out), dtype="float32", verify_weights=False)


def test_split_gguf_converts_into_one_ftw(q4_k_m_gguf, tmp_path):
    """A GGUF split into parts (gguf-split's naming) becomes one FTW file with the same logits."""
    first = rewrite(q4_k_m_gguf, tmp_path / "split.gguf", split_max_tensors=10)
    assert "-00001-of-" in first.name
    out = tmp_path / "m.ftw"
    assert cli_main(["convert", "--model", str(first), "--out", str(out)]) == 0
    ids = ids_for(23, seed=3)
    assert torch.equal(LLM(str(out), dtype="float32").score(ids), LLM(str(q4_k_m_gguf), dtype="float32").score(ids))
