"""`freetoken pull` against local registries (tests/registries.py): an Ollama library model and
Hugging Face repos (a safetensors checkpoint, one quantization of a GGUF repo) land in their
standard stores, `--model NAME` then loads exactly those bytes, and every failure (unknown name,
no network, no disk space, a cut connection, a corrupt byte) is one line that leaves nothing
half-written in the store. huggingface_hub's own cache lookup is the independent check of
the HF layout."""
from __future__ import annotations

import hashlib
import socket

import pytest
from registries import HfHub, OllamaRegistry

from freetoken import LLM
from freetoken.cli import main
from freetoken.sampling_params import SamplingParams
from freetoken.weights.stores import resolve_model

MODEL = "application/vnd.ollama.image.model"
TEMPLATE = "application/vnd.ollama.image.template"


@pytest.fixture
def stores(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("FREETOKEN_OLLAMA_REGISTRY", raising=False)
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    return tmp_path


@pytest.fixture(scope="module")
def gguf(tiny_dir, to_gguf):
    return to_gguf(tiny_dir("qwen3_moe"), "q8_0")


@pytest.fixture
def registry(gguf):
    with OllamaRegistry() as r:
        r.add("tiny", "q8", [(MODEL, gguf.read_bytes()), (TEMPLATE, b"{{ .Prompt }}")])
        yield r


def pull(capsys, *args) -> tuple[int, str, list[str]]:
    rc = main(["pull", *args])
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if line.strip()]


def files_under(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink())


def first_tokens(model: str, n: int = 4) -> list[int]:
    llm = LLM(model, dtype="float32", max_model_len=256)
    try:
        return llm.generate([[1, 2, 3]], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[0].token_ids
    finally:
        llm.close()


def test_ollama_pull_stores_the_model_as_ollama_does_and_serves_it(stores, registry, gguf, capsys):
    rc, out, _ = pull(capsys, "tiny:q8", "--registry", registry.url)
    assert rc == 0
    models = stores / "ollama"
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "q8"
    assert manifest.read_bytes() == registry.manifests["/v2/library/tiny/manifests/q8"]
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    blob = models / "blobs" / f"sha256-{digest}"
    assert blob.read_bytes() == gguf.read_bytes()
    assert len(files_under(models / "blobs")) == 3 and not any(".partial" in f for f in files_under(models))
    assert resolve_model("tiny:q8") == str(blob) and out.startswith("tiny:q8: ")
    assert first_tokens("tiny:q8") == first_tokens(str(gguf))
    assert pull(capsys, "library/tiny:q8", "--registry", registry.url)[0] == 0     # again: nothing fetched
    assert sum("/blobs/" in p for _, p, _ in registry.requests) == 3


@pytest.mark.parametrize("retries", [0, 3])
def test_a_cut_connection_resumes_with_a_range_request(stores, registry, gguf, capsys, retries):
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    half = gguf.stat().st_size // 2
    registry.cut[digest] = half
    rc, _, err = pull(capsys, "tiny:q8", "--registry", registry.url, "--retries", str(retries))
    blobs = stores / "ollama" / "blobs"
    if retries == 0:                  # the command fails, keeps what it got, and the next one resumes
        assert rc == 2 and len(err) == 1 and "connection lost" in err[0] and "resume" in err[0]
        assert (blobs / f"{digest.replace(':', '-')}.partial").stat().st_size == half
        assert not (stores / "ollama" / "manifests").exists()
        rc, _, _ = pull(capsys, "tiny:q8", "--registry", registry.url)
    assert rc == 0
    assert registry.ranges(digest) == [None, f"bytes={half}-"]
    assert (blobs / digest.replace(":", "-")).read_bytes() == gguf.read_bytes()
    assert not any(".partial" in f for f in files_under(blobs))


def test_a_corrupt_blob_is_refused_and_nothing_is_kept(stores, registry, gguf, capsys):
    registry.corrupt.add("sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest())
    rc, _, err = pull(capsys, "tiny:q8", "--registry", registry.url)
    assert rc == 2 and len(err) == 1 and "sha256 mismatch" in err[0]
    models = stores / "ollama"
    assert not (models / "manifests").exists()
    assert not any(f.startswith("sha256-" + hashlib.sha256(gguf.read_bytes()).hexdigest()) for f in
                   (p.name for p in (models / "blobs").iterdir()))
    with pytest.raises(Exception, match="not found"):
        resolve_model("tiny:q8")


def test_unknown_names_and_no_network_are_one_line(stores, registry, capsys):
    rc, _, err = pull(capsys, "nosuch:7b", "--registry", registry.url)
    assert rc == 2 and len(err) == 1 and "no such model in the Ollama library" in err[0] and "404" in err[0]
    with socket.socket() as s:               # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    rc, _, err = pull(capsys, "tiny:q8", "--registry", dead)
    assert rc == 2 and len(err) == 1 and "cannot reach 127.0.0.1" in err[0]
    assert not (stores / "ollama").exists()


def test_too_little_disk_space_is_refused_before_writing(stores, registry, hub, monkeypatch, capsys):
    monkeypatch.setattr("freetoken.hub.download.free_bytes", lambda d: 1 << 20)
    rc, _, err = pull(capsys, "tiny:q8", "--registry", registry.url)
    assert rc == 2 and len(err) == 1 and "GiB more" in err[0] and "free" in err[0]
    rc, _, err = pull(capsys, "org/tiny")
    assert rc == 2 and len(err) == 1 and "GiB more" in err[0]
    assert files_under(stores) == []
    assert not any("/blobs/" in p or "/resolve/" in p for _, p, _ in registry.requests + hub.requests)


# --- Hugging Face -------------------------------------------------------------------------------

@pytest.fixture
def hub(stores, tiny_dir, gguf, monkeypatch):
    with HfHub(token="hf_secret") as h:
        d = tiny_dir("qwen3_moe")
        h.add("org/tiny", {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()})
        h.add("org/tiny-GGUF", {"tiny-Q8_0.gguf": gguf.read_bytes(), "tiny-F32.gguf": b"GGUF never fetched",
                                "README.md": b"# tiny\n"})
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        yield h


def test_hf_pull_fills_the_hub_cache_as_huggingface_hub_reads_it(stores, hub, tiny_dir, capsys):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache
    rc, out, _ = pull(capsys, "org/tiny")
    assert rc == 0
    d = tiny_dir("qwen3_moe")
    commit = hub.repos["org/tiny"][0]
    for p in d.iterdir():
        if p.is_file():
            got = try_to_load_from_cache("org/tiny", p.name, cache_dir=stores / "hf")
            assert got and open(got, "rb").read() == p.read_bytes(), p.name
    info = next(r for r in scan_cache_dir(stores / "hf").repos if r.repo_id == "org/tiny")
    assert {rev.commit_hash for rev in info.revisions} == {commit} and info.refs["main"].commit_hash == commit
    assert resolve_model("org/tiny").endswith(f"snapshots/{commit}")
    assert all(h.get("authorization") == "Bearer hf_secret" for m, p, h in hub.requests if "/api/" in p)
    assert first_tokens("org/tiny") == first_tokens(str(d))


def test_hf_without_a_token_is_one_line_naming_hf_token(stores, hub, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    rc, _, err = pull(capsys, "org/tiny")
    assert rc == 2 and len(err) == 1 and "HF_TOKEN" in err[0]
    rc, _, err = pull(capsys, "org/nosuch")
    assert rc == 2 and len(err) == 1 and "org/nosuch" in err[0]


def test_hf_gguf_repo_one_quantization(stores, hub, gguf, capsys):
    rc, _, err = pull(capsys, "org/tiny-GGUF")             # two quantizations: which one?
    assert rc == 2 and len(err) == 1 and "Q8_0" in err[0] and "F32" in err[0]
    rc, _, err = pull(capsys, "org/tiny-GGUF:Q4_K_M")
    assert rc == 2 and len(err) == 1 and "no GGUF file of quantization Q4_K_M" in err[0]
    rc, out, _ = pull(capsys, "hf.co/org/tiny-GGUF:Q8_0")
    assert rc == 0 and out.startswith("org/tiny-GGUF:Q8_0: ")
    path = resolve_model("org/tiny-GGUF:Q8_0")
    assert path.endswith("tiny-Q8_0.gguf") and open(path, "rb").read() == gguf.read_bytes()
    assert not any("F32" in p for _, p, _ in hub.requests)
    assert resolve_model("org/tiny-GGUF") == path          # the only GGUF in the snapshot
    rc, _, _ = pull(capsys, "org/tiny-GGUF", "--include", "README*")
    assert rc == 0 and (stores / "hf").rglob("README.md")


def test_hf_cut_and_corrupt_files(stores, hub, gguf, capsys):
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    hub.cut[sha] = 1000
    rc, _, err = pull(capsys, "org/tiny-GGUF:Q8_0", "--retries", "0")
    assert rc == 2 and "connection lost" in err[0]
    blobs = stores / "hf" / "models--org--tiny-GGUF" / "blobs"
    assert [p.name for p in blobs.iterdir()] == [f"{sha}.partial"]
    assert not (stores / "hf" / "models--org--tiny-GGUF" / "snapshots").exists()
    hub.corrupt.add(sha)                           # the rest arrives corrupt: refused, partial gone
    rc, _, err = pull(capsys, "org/tiny-GGUF:Q8_0")
    assert rc == 2 and len(err) == 1 and "sha256 mismatch" in err[0]
    assert list(blobs.iterdir()) == []
    hub.corrupt.clear()
    assert pull(capsys, "org/tiny-GGUF:Q8_0")[0] == 0
    assert hub.ranges(f"/cdn/{sha}") == [None, "bytes=1000-", None]


def test_two_pulls_of_one_model_at_once_fetch_each_blob_once(stores, registry, gguf):
    from concurrent.futures import ThreadPoolExecutor

    from freetoken.hub import ollama
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: ollama.pull("tiny:q8", registry=registry.url), range(2)))
    assert got[0] == got[1] and got[0].is_file()
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert len(registry.ranges(digest)) == 1
    assert (stores / "ollama" / "blobs" / digest.replace(":", "-")).read_bytes() == gguf.read_bytes()
