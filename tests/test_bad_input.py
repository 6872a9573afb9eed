"""Bad checkpoints and requests: one clear line naming the file/field, exit code 2 from the CLI."""
from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from freetoken import LLM
from freetoken.cli import main
from freetoken.errors import CheckpointError, UnsupportedModelError


@pytest.fixture
def ckpt(tiny_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(tiny_dir("qwen3_moe"), d)
    return d


def _load(d):
    return LLM(str(d), dtype="float32")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        _load(ckpt)


def test_malformed_config(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="malformed JSON"):
        _load(ckpt)


def test_config_field_of_wrong_type(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["hidden_size"] = "sixty-four"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'hidden_size'.*expected int"):
        _load(ckpt)


@pytest.mark.parametrize("field,value", [("rope_parameters", -1), ("rope_scaling", "yarn"), ("layer_types", 3)])
def test_config_object_or_list_field_of_wrong_shape(ckpt, field, value):
    """Found by bench/fuzz_files.py: `rope_parameters: -1` raised TypeError deep in the rope code."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[field] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=f"config.json: field '{field}'.*expected an? (object|list) or null"):
        _load(ckpt)


@pytest.mark.parametrize("value", [1e308, ["<eos>"], {"content": 7}])
def test_special_token_of_wrong_type(ckpt, value):
    """Found by bench/fuzz_files.py: `eos_token: 1e308` raised TypeError in the tokenizer."""
    path = ckpt / "tokenizer_config.json"
    tc = json.loads(path.read_text()) if path.exists() else {}
    tc["eos_token"] = value
    path.write_text(json.dumps(tc))
    with pytest.raises(CheckpointError, match="tokenizer_config.json: field 'eos_token'.*expected a token string"):
        _load(ckpt)


def test_unsupported_architecture(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["BertForMaskedLM"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="BertForMaskedLM.*not supported"):
        _load(ckpt)


def test_tensor_of_wrong_shape(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.layers.0.self_attn.o_proj.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="o_proj.weight.*expected"):
        _load(ckpt)


def test_tensor_of_wrong_dtype(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(dtype=__import__("torch").int32)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="model.norm.weight.*dtype"):
        _load(ckpt)


def test_missing_shard(tiny_dir, tmp_path):
    import transformers
    from helpers import save_hf_checkpoint
    config = transformers.Qwen3MoeConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, intermediate_size=64)
    d = save_hf_checkpoint(config, tmp_path / "sharded", tiny_dir("qwen3_moe"), max_shard_size="100KB")
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        _load(d)


def test_missing_tensor(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="experts.3.up_proj.weight.*not found"):
        _load(ckpt)


def test_cli_reports_one_line_and_exit_code_2(ckpt, capsys):
    (ckpt / "config.json").write_text("[]")
    rc = main(["generate", "--model", str(ckpt), "--prompt", "hi"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "config.json" in err


@pytest.mark.parametrize("flag,value", [("--state-cache-gib", "1e12"), ("--kv-cache-gib", "1e308"),
                                        ("--expert-cache-gib", "nan")])
def test_cli_absurd_memory_sizes_one_line(tiny_dir, capsys, flag, value):
    """Refused by the config check, before a plan multiplies them or anything is allocated."""
    rc = main(["generate", "--model", str(tiny_dir("qwen3_moe")), "--prompt", "hi", flag, value])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and flag[2:].replace("-", "_") in err and "GiB" in err, err


def test_cli_prompt_too_long(tiny_dir, capsys):
    rc = main(["generate", "--model", str(tiny_dir("qwen3_moe")), "--prompt", "hello " * 50, "--max-model-len", "16"])
    assert rc == 2 and "context" in capsys.readouterr().err


def test_cli_generate_json(tiny_dir, capsys):
    rc = main(["generate", "--model", str(tiny_dir("qwen3_moe")), "--prompt", "hello", "--max-tokens", "4",
               "--seed", "3", "--json", "--dtype", "float32"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(out["token_ids"]) <= 4 and isinstance(out["text"], str)


# ---- issue 25.5: damaged and hostile model files through the real CLI (bench/bad_files.py) ----

BAD_FILES_CI = ["num_hidden_layers=1000000000", "num_attention_heads=0", "num_experts=1000000000000",
                "hidden_size='sixty-four'", "vocab_size=10000000000000000000000000000000000000000",
                "rope_theta=-1", "rms_norm_eps=nan", "config_nested_100k", "config_5000_digits",
                "config_fifo", "safetensors_fifo", "long_model_name", "ftw_header_2^62",
                "ftw_num_experts_1e9", "gguf_alignment_0", "template_recursion", "template_class",
                "template_300mb", "template_spin", "safetensors_truncated", "tokenizer_not_utf8",
                "tokenizer_config_not_utf8", "template_raises_at_render"]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bad_files as bf
    root = tmp_path_factory.mktemp("bad-files")
    work = root / "work"
    work.mkdir()
    return bf, bf.tiny_dir(root), work


def test_bad_file_generator_has_over_100_cases(bad_files):
    bf, _, _ = bad_files
    assert len(bf.cases()) >= 101
    assert set(BAD_FILES_CI) <= set(bf.cases())


@pytest.mark.parametrize("name", BAD_FILES_CI)
def test_bad_file_one_line_exit_2(bad_files, name):
    bf, tiny, work = bad_files
    ok, what = bf.run_case(name, bf.cases()[name], tiny, work, timeout=5, in_process=True)
    assert ok, what


def test_seeded_bad_file_mutations(bad_files):
    """The first 18 of bench/fuzz_api.py --files (seed 0; two rounds of each kind): each runs
    or stops with one line and exit 2 (non-UTF-8 tokenizer files and templates that raise
    when rendering once ended in a traceback)."""
    import fuzz_files  # on sys.path through the bad_files fixture (bench/)
    r = fuzz_files.run_files(18, 0, timeout=120)   # the 5 s bound is the bench's; CI machines are loaded
    assert r["ok"], {k: v for k, v in r["cases"].items() if not v["ok"]}


@pytest.mark.parametrize("name", ["safetensors_fifo", "num_attention_heads=0", "template_300mb"])
def test_bad_file_real_cli_process(bad_files, name):
    """A fresh `python -m freetoken.cli generate`: one line, exit 2, never a hang (the time
    bound is the bench's; a test allows for a loaded machine)."""
    bf, tiny, work = bad_files
    ok, what = bf.run_case(name, bf.cases()[name], tiny, work, timeout=600)
    assert ok, what
