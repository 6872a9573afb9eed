"""Shared fixtures: tiny random checkpoints written by transformers' own classes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from freetoken.tiny import make_tiny

# Tests never assert timings: hypothesis' default 200 ms per-example deadline fails on a loaded
# machine (seen at load 15-19), so it is off for every property test.
settings.register_profile("freetoken", deadline=None)
settings.load_profile("freetoken")


# The CPU's automatic choices (kernels/choices.py), each forced once with the others left to the
# machine: EngineConfig options for tests that must hold on every path, not only the one this
# CPU picks (their plain version runs the machine's own pick). A kernel build this CPU cannot run skips.
CPU_CHOICES = {
    "gemm-fp32": {"prefill_gemm": "float32"}, "gemm-bf16": {"prefill_gemm": "bfloat16"},
    "gemm-amx": {"prefill_gemm": "amx"}, "gemm-vdpbf16ps": {"prefill_gemm": "vdpbf16ps"},
    "dot-on": {"bf16_dot": "on"}, "dot-off": {"bf16_dot": "off"},
    "isa-avx2": {"kernel_isa": "avx2"}, "isa-portable": {"kernel_isa": "portable"},
    "gemv-amx": {"decode_gemv": "amx"}, "gemv-dots": {"decode_gemv": "dots"},
    "attn-amx": {"decode_attention": "amx"}, "attn-fp32": {"decode_attention": "fp32"},
    "pattn-amx": {"prefill_attention": "amx"}, "pattn-vdpbf16ps": {"prefill_attention": "vdpbf16ps"},
    "pattn-torch": {"prefill_attention": "torch"},
    "int8-ymm": {"int8_tiles": "ymm"}, "int8-zmm": {"int8_tiles": "zmm"},
}


@pytest.fixture(params=list(CPU_CHOICES))
def cpu_choice(request) -> dict:
    """EngineConfig options forcing one CPU choice (see CPU_CHOICES)."""
    from freetoken.kernels import variants_here
    opts = CPU_CHOICES[request.param]
    isa = opts.get("kernel_isa")
    if isa is not None and isa not in variants_here():
        pytest.skip(f"the {isa} kernel build does not run on this CPU (here: {', '.join(variants_here())})")
    if "amx" in (opts.get("prefill_gemm"), opts.get("decode_gemv"), opts.get("decode_attention"),
                 opts.get("prefill_attention")):
        from freetoken.kernels import load
        from freetoken.kernels.gemm import modes_here
        if load() is None or "amx" not in modes_here(load()):
            pytest.skip("AMX tiles do not run here (no amx_bf16, or the OS refuses the tile state)")
    if opts.get("prefill_attention") == "vdpbf16ps":
        from freetoken.kernels import load
        from freetoken.kernels.gemm import modes_here
        if load() is None or "vdpbf16ps" not in modes_here(load()):
            pytest.skip("vdpbf16ps does not run here (no avx512_bf16 in this kernel build)")
    if opts.get("int8_tiles") == "zmm":
        from freetoken.kernels import load
        lib = load()      # (the switch probed here is put back by kernel_switches_restored)
        if lib is None or not lib.ft_set_int8_zmm(1):
            pytest.skip("the zmm int8 tiles do not run here (no AVX-512 in this kernel build)")
    return opts


@pytest.fixture(autouse=True)
def verify_probe_off(request, monkeypatch):
    """The verify probe (engine/verify_probe.py) measures each new model once per machine, seconds
    on every fresh tiny checkpoint (CI +112 s): engines in tests start without it (their price
    fits online, as with `spec_probe` off) unless the test is marked `verify_probe`."""
    if request.node.get_closest_marker("verify_probe") is None:
        import freetoken.engine.llm_engine as llm_engine
        monkeypatch.setattr(llm_engine, "verify_curve", lambda engine: (None, "off in tests"))


@pytest.fixture(autouse=True)
def kernel_switches_restored():
    """The kernels' switches (and the torch executors' records of them) and torch's thread count
    put back after every test: a cheap guard. An engine's choices are its own (kernels/switch_set.py:
    installed for its steps only) and an idle or closed engine gives torch's threads back, so no
    engine leaves anything here; what it still catches is a test that sets a switch (ft_set_*) or
    torch's threads by hand and does not put them back (tests/kernels/test_roofline.py's probes
    leave torch at one thread), or leaves an engine mid-decode unclosed."""
    from freetoken.kernels.switch_set import SwitchSet
    saved, threads = SwitchSet.now(), torch.get_num_threads()
    yield
    saved.put()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def stack_off():
    """A decode step's layers called one by one, not through the stack's one call
    (layers/attention/decode_stack.py), for the test."""
    from freetoken.layers.attention import decode_stack
    decode_stack.STACK[0] = False
    yield
    decode_stack.STACK[0] = True


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one; `pytest -m cuda` runs them)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """tiny_dir(arch, **make_tiny kwargs) -> a cached checkpoint directory."""
    root = tmp_path_factory.mktemp("tiny")
    cache: dict = {}

    def get(arch: str = "qwen3_moe", **kw) -> Path:
        key = (arch, repr(sorted(kw.items())))      # repr: list-valued overrides too
        if key not in cache:
            cache[key] = make_tiny(arch, root / f"{arch}-{len(cache)}", **kw)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def real_tokenizer_dir(tmp_path_factory):
    """real_tokenizer_dir(vocab, template_file=None) -> a tokenizer directory converted from
    ../shared/data/tokenizers/ggml-vocab-<vocab>.gguf, with a chat template from
    ../shared/data/chat-templates/<template_file> (else the GGUF's own). Skips without the data."""
    from helpers import SHARED_DATA

    from freetoken.weights.gguf.tokenizer import save_tokenizer_dir
    root = tmp_path_factory.mktemp("realtok")
    cache: dict = {}

    def get(vocab: str, template_file: str | None = None) -> Path:
        gguf = SHARED_DATA / "tokenizers" / f"ggml-vocab-{vocab}.gguf"
        if not gguf.is_file():
            pytest.skip(f"real tokenizers not found at {gguf.parent} (shared data is not checked out)")
        if vocab not in cache:
            cache[vocab] = save_tokenizer_dir(gguf, root / vocab)
        if template_file is None:
            return cache[vocab]
        key = (vocab, template_file)
        if key not in cache:
            out = root / f"{vocab}-{len(cache)}"
            out.mkdir()
            template = (SHARED_DATA / "chat-templates" / template_file).read_text()
            cfg = json.loads((cache[vocab] / "tokenizer_config.json").read_text())
            cfg["chat_template"] = template
            (out / "tokenizer_config.json").write_text(json.dumps(cfg))
            (out / "tokenizer.json").symlink_to(cache[vocab] / "tokenizer.json")
            cache[key] = out
        return cache[key]

    return get
