"""No package reaches a private name of another: neither `from other.module import _name`
nor `obj._name` on an object that is not `self`/`cls` (a private attribute is the owner's to
change; a caller that needs it needs a public method). Third-party objects are outside this rule
only where named below with the reason."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "freetoken"
# (file, attribute): a library's private name we must call, with why
ALLOWED = {
    ("server/replicas/frontend.py", "_init"): "Ray Serve's DeploymentHandle makes its router only on first use",
}


def _package(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _target_package(f: Path, node: ast.ImportFrom) -> str | None:
    if node.level:
        base = list(f.relative_to(ROOT).parts[:-1])
        base = base[:len(base) - (node.level - 1)]
        parts = base + (node.module.split(".") if node.module else [])
    elif node.module and node.module.split(".")[0] == "freetoken":
        parts = node.module.split(".")[1:]
    else:
        return None
    return parts[0] if parts else ""


def violations() -> list[str]:
    out = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _target_package(f, node)
                if target is not None and target != _package(rel):
                    out += [f"{rel}:{node.lineno}: imports {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                if (str(rel), node.attr) in ALLOWED:
                    continue
                out.append(f"{rel}:{node.lineno}: reads {ast.unparse(owner)}.{node.attr}")
    return out


def test_no_package_reaches_a_private_name():
    found = violations()
    assert not found, "private names used from outside their owner:\n" + "\n".join(found)
