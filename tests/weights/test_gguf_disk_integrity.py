"""Disk-tier integrity (issue 36 item 1) on a copy of a small GGUF made by llama.cpp's converter:
the served file rewritten in place with plausible bytes (another region of itself), restored,
truncated and restored again, while the same engine keeps serving. Wrong bytes are never
served: the requests that need a changed expert fail with a clear error, the stats (and so
/health) say the file changed, nothing cached from before survives, and once the original is
back the engine gives the RAM-loaded model's tokens again."""
from __future__ import annotations

import os
import shutil

import pytest

from freetoken import LLM, SamplingParams
from freetoken.weights.gguf.reader import GgufFile

PROMPT = [5, 17, 3, 99, 42, 7, 250, 11]
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


def _disk_experts(llm: LLM):
    experts = llm.engine.model.experts
    return getattr(experts, "inner", experts)


def _integrity(llm: LLM) -> str:
    return llm.expert_stats()["disk"]["integrity"]


def _expert_tensors(path):
    ck = GgufFile(path)
    return sorted((t.offset, t.nbytes) for name, (_, t) in ck.tensors_by_name.items() if "_exps." in name)


def test_gguf_rewritten_restored_truncated_while_serving(tiny_dir, to_gguf, tmp_path):
    src = to_gguf(tiny_dir("qwen3_moe"), "q8_0")
    served = tmp_path / "served.gguf"
    shutil.copyfile(src, served)
    original = served.read_bytes()
    ref = LLM(str(served), dtype="float32", expert_tier="ram")
    want = ref.generate([PROMPT], GREEDY)[0].token_ids
    ref.close()

    llm = LLM(str(served), dtype="float32", host_cache_slots=4, prefix_cache=False)
    disk = _disk_experts(llm)
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    assert _integrity(llm) == "ok" and llm.expert_stats()["host_cache"]["resident"] > 0

    # 1. rewritten in place: the first expert tensor gets the bytes of the last one (plausible values)
    tensors = _expert_tensors(served)
    (a_off, a_n), (b_off, b_n) = tensors[0], tensors[-1]
    n = min(a_n, b_n)
    with open(served, "r+b") as f:
        f.seek(a_off)
        f.write(original[b_off:b_off + n])
    with pytest.raises(RuntimeError, match="does not match its checksum|changed"):
        llm.generate([PROMPT], GREEDY)
    assert _integrity(llm) in ("changed", "verifying")
    disk.watch.wait(30)
    assert _integrity(llm) == "changed"                   # the re-verification found the change
    assert llm.expert_stats()["disk"]["checksum_mismatches"] >= 1

    # 2. restored (same inode, a new mtime): re-verified, then it serves the right tokens again
    with open(served, "r+b") as f:
        f.write(original)
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    disk.watch.wait(30)
    assert _integrity(llm) == "ok"

    # 3. truncated inside the expert banks, then copied back (a new file at the same path)
    os.truncate(served, a_off + a_n // 2)
    with pytest.raises(RuntimeError, match="truncated|shorter|does not match"):
        llm.generate([PROMPT], GREEDY)
    assert _integrity(llm) != "ok"
    tmp = tmp_path / "restore.gguf"
    tmp.write_bytes(original)
    os.replace(tmp, served)                               # a new inode
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    disk.watch.wait(30)
    assert _integrity(llm) == "ok"
    st = llm.expert_stats()["disk"]
    assert st["file_changes"] >= 3
    llm.close()


def test_identity_change_drops_every_cached_expert(tiny_dir, to_gguf, tmp_path):
    """A file touched (same bytes, new mtime): nothing read before is kept; it serves on."""
    served = tmp_path / "served.gguf"
    shutil.copyfile(to_gguf(tiny_dir("qwen3_moe"), "q8_0"), served)
    llm = LLM(str(served), dtype="float32", host_cache_slots=64, prefix_cache=False)
    want = llm.generate([PROMPT], GREEDY)[0].token_ids
    reads = llm.expert_stats()["disk"]["reads"]
    st = os.stat(served)
    os.utime(served, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    after = llm.expert_stats()
    assert after["disk"]["reads"] >= 2 * reads            # everything read again, verified
    _disk_experts(llm).watch.wait(30)
    assert _integrity(llm) == "ok"
    llm.close()
