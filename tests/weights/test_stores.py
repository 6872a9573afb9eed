"""--model resolution from fake local stores built in tmp dirs: paths, split GGUF parts,
Ollama manifests -> blobs, the Hugging Face hub cache; one-line errors listing where we looked."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from freetoken.errors import CheckpointError
from freetoken.weights.stores import resolve_model


@pytest.fixture
def home(tmp_path, monkeypatch):
    for var in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def ollama_store(home, name, tag, payload: bytes, media="application/vnd.ollama.image.model"):
    models = home / ".ollama" / "models"
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    (models / "blobs" / digest.replace(":", "-")).write_bytes(payload)
    path = name if "/" in name else f"library/{name}"
    manifest = models / "manifests" / "registry.ollama.ai" / path / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1},
        {"mediaType": media, "digest": digest, "size": len(payload)}]}))
    return models / "blobs" / digest.replace(":", "-")


def test_existing_paths_pass_through(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    assert resolve_model(d) == str(d)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(f) == str(f)


def test_split_gguf_resolves_to_the_first_part_and_needs_all(tmp_path):
    parts = [tmp_path / f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for p in parts:
        p.write_bytes(b"GGUF")
    assert resolve_model(parts[1]) == str(parts[0])
    parts[2].unlink()
    with pytest.raises(CheckpointError, match="missing part.*m-00003-of-00003.gguf"):
        resolve_model(parts[0])


def test_ollama_name_and_tag(home):
    blob = ollama_store(home, "qwen3", "30b-a3b", b"GGUF model bytes")
    latest = ollama_store(home, "qwen3", "latest", b"GGUF other bytes")
    assert resolve_model("qwen3:30b-a3b") == str(blob)
    assert resolve_model("qwen3") == str(latest)
    user = ollama_store(home, "someone/mymoe", "q4", b"GGUF user bytes")
    assert resolve_model("someone/mymoe:q4") == str(user)


def test_ollama_models_env_and_broken_manifests(home, tmp_path, monkeypatch):
    blob = ollama_store(home, "m", "latest", b"GGUF x")
    moved = tmp_path / "elsewhere"
    shutil.move(str(home / ".ollama" / "models"), moved)
    monkeypatch.setenv("OLLAMA_MODELS", str(moved))
    assert resolve_model("m") == str(moved / "blobs" / blob.name)
    (moved / "blobs" / blob.name).unlink()
    with pytest.raises(CheckpointError, match="model blob .* is missing"):
        resolve_model("m")
    ollama_store(home, "adapter", "latest", b"x", media="application/vnd.ollama.image.adapter")
    monkeypatch.delenv("OLLAMA_MODELS")
    with pytest.raises(CheckpointError, match="no layer of mediaType application/vnd.ollama.image.model"):
        resolve_model("adapter")


def hf_snapshot(cache, repo, rev, files, ref=True):
    base = cache / f"models--{repo.replace('/', '--')}"
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    if ref:
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(rev)
    return snap


def test_hf_repo_id_from_the_hub_cache(home, tmp_path, monkeypatch):
    cache = home / ".cache" / "huggingface" / "hub"
    snap = hf_snapshot(cache, "Org/Model-A3B", "abc123", {"config.json": b"{}"})
    hf_snapshot(cache, "Org/Model-A3B", "old000", {"config.json": b"{}"}, ref=False)
    assert resolve_model("Org/Model-A3B") == str(snap)
    ggufs = hf_snapshot(cache, "Org/Model-GGUF", "r1", {"model-Q4_K_M.gguf": b"GGUF"})
    assert resolve_model("Org/Model-GGUF") == str(ggufs / "model-Q4_K_M.gguf")
    hf_home = tmp_path / "hfhome"
    other = hf_snapshot(hf_home / "hub", "Org/Other", "r2", {"config.json": b"{}"})
    monkeypatch.setenv("HF_HOME", str(hf_home))
    assert resolve_model("Org/Other") == str(other)
    hub = tmp_path / "hubcache"
    third = hf_snapshot(hub, "Org/Third", "r3", {"config.json": b"{}"})
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert resolve_model("Org/Third") == str(third)


def test_several_gguf_files_in_a_snapshot_need_a_choice(home):
    cache = home / ".cache" / "huggingface" / "hub"
    hf_snapshot(cache, "Org/Many-GGUF", "r", {"a-Q4_K_M.gguf": b"GGUF", "a-Q8_0.gguf": b"GGUF"})
    with pytest.raises(CheckpointError, match="several GGUF files"):
        resolve_model("Org/Many-GGUF")


def test_a_quantization_tag_picks_the_gguf(home):
    cache = home / ".cache" / "huggingface" / "hub"
    snap = hf_snapshot(cache, "Org/Many-GGUF", "r", {"a-Q4_K_M.gguf": b"GGUF", "a-Q4_K_S.gguf": b"GGUF",
                                                     "a-Q8_0.gguf": b"GGUF"})
    (snap / "UD-Q4_K_XL").mkdir()
    for i in (1, 2):
        (snap / "UD-Q4_K_XL" / f"a-UD-Q4_K_XL-0000{i}-of-00002.gguf").write_bytes(b"GGUF")
    assert resolve_model("Org/Many-GGUF:Q4_K_M") == str(snap / "a-Q4_K_M.gguf")
    assert resolve_model("Org/Many-GGUF:q8_0") == str(snap / "a-Q8_0.gguf")
    assert resolve_model("Org/Many-GGUF:Q4_K_XL") == str(snap / "UD-Q4_K_XL" / "a-UD-Q4_K_XL-00001-of-00002.gguf")
    with pytest.raises(CheckpointError, match="no GGUF file of quantization Q4_K "):
        resolve_model("Org/Many-GGUF:Q4_K")           # Q4_K is neither Q4_K_M nor Q4_K_S
    with pytest.raises(CheckpointError, match="no GGUF file of quantization IQ2_XXS"):
        resolve_model("Org/Many-GGUF:IQ2_XXS")


def test_not_found_lists_every_place_looked(home):
    with pytest.raises(CheckpointError) as e:
        resolve_model("someorg/nothing")
    msg = str(e.value)
    assert "\n" not in msg and "path " in msg and "Ollama manifest" in msg and "Hugging Face cache" in msg
    assert "models--someorg--nothing" in msg and "registry.ollama.ai/someorg/nothing/latest" in msg
