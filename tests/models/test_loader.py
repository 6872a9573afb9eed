"""The loader owns loading: models build dense modules and an ExpertPool; the loader applies
`expert_format` and builds the experts backend."""
import ast
from pathlib import Path

import torch

import freetoken.models as models_pkg
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
from freetoken.loading.loader import with_format

MODELS = Path(models_pkg.__file__).parent


def _runtime_imports(path: Path) -> set[str]:
    """Modules a file imports outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    return {"." * n.level + (n.module or "") for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and id(n) not in skip}


def test_no_model_file_imports_the_config_or_the_backend_factory():
    for f in MODELS.glob("*.py"):
        if f.name in ("loader.py", "experts_backend.py", "convert.py"):     # the wiring, and convert built on it
            continue
        bad = {m for m in _runtime_imports(f) if m in ("..config", ".experts_backend")
               or m.endswith("freetoken.config") or m.endswith("experts_backend")}
        assert not bad, f"{f.name} imports {bad}: wiring belongs in loading/loader.py"


def _pool(fmt: str) -> ExpertPool:
    h, i = 32, 64
    if fmt == "float":
        banks = {"gate_up": torch.randn(2, 2 * i, h), "down": torch.randn(2, h, i)}
    else:
        banks = {"gate_up_blocks": torch.zeros(2, 2 * i, h // 32, 16, dtype=torch.uint8)}
    return ExpertPool(banks, 1, 2, ExpertSpec(hidden=h, intermediate=i, fmt=fmt))


def test_with_format_reencodes_float_pools_and_keeps_shipped_quantized_ones():
    pool = _pool("float")
    assert with_format(pool, None) is pool
    assert with_format(pool, "int8").spec.fmt == "int8"
    packed = _pool("mxfp4")
    assert with_format(packed, "int8") is packed
