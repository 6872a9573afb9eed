"""Bad GGUF input gives one-line errors naming the file and what was expected."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from freetoken.errors import CheckpointError
from freetoken.weights.gguf.reader import GgufFile


def write(path, arch="qwen3moe", meta=True):
    w = gguf.GGUFWriter(str(path), arch)
    if meta:
        w.add_block_count(1)
        w.add_embedding_length(32)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture(tmp_path):
    with pytest.raises(CheckpointError, match=r"general.architecture = 'bert' is not supported \(supported: .*qwen3moe"):
        GgufFile(write(tmp_path / "b.gguf", "bert"))


@pytest.mark.parametrize("arch", ["glm5-next", "kimi-k3", "minimax-m3"])
def test_families_llamacpp_writes_but_no_class_reads(tmp_path, arch):
    with pytest.raises(CheckpointError, match=rf"general.architecture = '{arch}' \(.*\) is not read from GGUF yet"):
        GgufFile(write(tmp_path / "n.gguf", arch))


def test_missing_metadata_names_the_key(tmp_path):
    with pytest.raises(CheckpointError, match=r"metadata key qwen3moe.attention.head_count is missing"):
        GgufFile(write(tmp_path / "m.gguf"))


def test_truncated_and_foreign_files(tmp_path):
    p = write(tmp_path / "t.gguf")
    data = p.read_bytes()
    p.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated: tensor 'token_embd.weight'"):
        GgufFile(p)
    p.write_bytes(b"GGUF" + b"\x01\x00\x00\x00" + b"\x00" * 16)
    with pytest.raises(CheckpointError, match="GGUF version 1 is too old"):
        GgufFile(p)


def test_deepseek2_unknown_router_is_refused(tiny_dir, to_gguf, tmp_path):
    """deepseek2 routes with sigmoid (V3) or softmax (V2) scores; another gating function is a
    clear error, not wrong logits."""
    from gguf_rewrite import rewrite
    g = rewrite(to_gguf(tiny_dir("deepseek_v3"), "f32"), tmp_path / "g.gguf",
                set_keys={"deepseek2.expert_gating_func": 4})
    with pytest.raises(CheckpointError, match=r"deepseek2.expert_gating_func = 4 \(sqrtsoftplus\) is not supported "
                                              r"\(expected 2, sigmoid: .*or 1, softmax: DeepSeek-V2\)"):
        GgufFile(g)
