"""The package reads downhill: every import of a freetoken module (module-level, function-local
and under TYPE_CHECKING, relative ones resolved) goes to the importer's own layer or one below,
in the layer order that docs/architecture.md states; no modules import each other in a circle;
and a function-local import of a freetoken module says why it is local (a comment on its line or
the line above), since a hidden import hides the layering.

`python tests/test_layering.py` prints the package graph and whatever breaks the rules."""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "freetoken"
DOC = REPO / "docs" / "architecture.md"
ROOT_PACKAGE = "freetoken"          # the package's own __init__.py, named like this in the layer list


@dataclass(frozen=True)
class Import:
    src: str            # dotted module names
    dst: str
    file: str           # relative to freetoken/
    line: int
    local: bool         # inside a function
    commented: bool     # a comment on its line or the line above
    type_only: bool     # under `if TYPE_CHECKING:`: names a dependency, never runs


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in mods:
            return ".".join(parts)
        parts = parts[:-1]
    return None


def imports(root: Path = ROOT) -> list[Import]:
    mods = modules(root)
    out = []
    for name, f in mods.items():
        lines = f.read_text().splitlines()
        here = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]

        def commented(node) -> bool:
            """A comment on the import's line, or above the run of import lines it is part of."""
            n = node.lineno - 1
            while n > 0 and lines[n - 1].strip().startswith(("from ", "import ")) and "#" not in lines[n]:
                n -= 1
            return "#" in lines[node.lineno - 1] or "#" in lines[n] or (n > 0 and lines[n - 1].strip().startswith("#"))

        def targets(node) -> set[str]:
            if isinstance(node, ast.Import):
                return {t for a in node.names if (t := _resolve(a.name, mods)) and a.name.split(".")[0] == ROOT_PACKAGE}
            if node.level:
                full = here[:len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == ROOT_PACKAGE:
                full = node.module.split(".")
            else:
                return set()
            base = _resolve(".".join(full), mods)
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            return {sub if (sub := ".".join(full + [a.name])) in mods else base for a in node.names} - {None}

        def walk(node, local: bool, typing: bool):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    out.extend(Import(name, t, str(f.relative_to(root)), child.lineno, local, commented(child), typing)
                               for t in sorted(targets(child)))
                walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                     typing or (isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING")))
        walk(ast.parse("\n".join(lines), str(f)), False, False)
    return out


def package(module: str) -> str:
    """The unit the layer order ranks: a top-level package or module of freetoken."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT_PACKAGE


def layer_order() -> dict[str, int]:
    """docs/architecture.md, section "Layers": a numbered list, bottom first, each item naming its
    packages in backticks (`kernels/`, `config.py`, `freetoken/__init__.py`) before a colon."""
    text = DOC.read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rank = {}
    for line in section.splitlines():
        m = re.match(r"\s*(\d+)\.\s+(.*)", line)
        if not m:
            continue
        for name in re.findall(r"`([^`]+)`", m.group(2).split(":", 1)[0]):
            name = ROOT_PACKAGE if name == "freetoken/__init__.py" else name.removesuffix("/").removesuffix(".py")
            rank[name] = int(m.group(1))
    return rank


def packages(root: Path = ROOT) -> set[str]:
    return {package(m) for m in modules(root)}


def climbs(rank: dict[str, int], root: Path = ROOT) -> list[str]:
    return [f"{i.file}:{i.line}: {package(i.src)} (layer {rank[package(i.src)]}) imports {i.dst} "
            f"(layer {rank[package(i.dst)]})"
            for i in imports(root) if rank.get(package(i.dst), 0) > rank.get(package(i.src), 0)]


def cycles(root: Path = ROOT) -> list[list[str]]:
    """Strongly connected sets of modules (Tarjan), every import counted, a `TYPE_CHECKING` one
    too: a type named across a circle is a circle a reader walks around all the same."""
    graph: dict[str, set[str]] = {m: set() for m in modules(root)}
    for i in imports(root):
        if i.src != i.dst:
            graph[i.src].add(i.dst)
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))
    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# Files whose function-local imports all have one reason.
LOCAL_IMPORTS_OK = {
    "cli/__init__.py": "every `freetoken` call builds the whole parser: a verb loads its subsystem when it runs",
    "cli/check.py": "as cli/__init__.py",
    "cli/convert.py": "as cli/__init__.py",
    "cli/plan.py": "as cli/__init__.py",
    "cli/perplexity.py": "as cli/__init__.py",
    "cli/profile.py": "as cli/__init__.py",
    "cli/serve.py": "as cli/__init__.py (FastAPI, uvicorn, Ray load when serving)",
    "hub/cli.py": "as cli/__init__.py (the registry clients load when pulling)",
    "sim/cli.py": "as cli/__init__.py",
    "sim/sessions/cli.py": "as cli/__init__.py (the tokenizers load when replaying)",
}


def unexplained_local_imports(root: Path = ROOT) -> list[str]:
    return [f"{i.file}:{i.line}: imports {i.dst} inside a function without a reason"
            for i in imports(root) if i.local and not i.commented and i.file not in LOCAL_IMPORTS_OK]


def test_every_package_has_a_layer():
    missing = packages() - set(layer_order())
    assert not missing, f"docs/architecture.md, Layers: no layer for {sorted(missing)}"


def test_no_import_climbs_a_layer():
    found = climbs(layer_order())
    assert not found, "imports from a lower layer to a higher one:\n" + "\n".join(found)


def test_no_import_cycles():
    found = cycles()
    assert not found, "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in found)


# Building a model goes one way: the loading wiring imports the architectures, never back.
LOADING = ("freetoken.loading", "freetoken.loading.loader", "freetoken.loading.experts_backend",
           "freetoken.loading.disk_layout", "freetoken.loading.convert")


def _is(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def model_imports_of_loading(root: Path = ROOT) -> list[str]:
    return [f"{i.file}:{i.line}: {i.src} imports {i.dst}" for i in imports(root)
            if _is(i.src, ("freetoken.models",)) and not _is(i.src, LOADING) and _is(i.dst, LOADING)]


def test_the_model_package_imports_nothing_from_loading():
    found = model_imports_of_loading()
    assert not found, "architectures import the loading wiring (build goes one way):\n" + "\n".join(found)


def test_function_local_imports_say_why():
    found = unexplained_local_imports()
    assert not found, "function-local imports without a reason comment:\n" + "\n".join(found)


def test_the_checker_finds_climbs_cycles_and_silent_local_imports(tmp_path):
    """On a made-up package whose faults are known: a relative climb, a cycle closed by a
    function-local import, a silent local import, and a cycle closed by a type-only import."""
    pkg = tmp_path / "freetoken"
    files = {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from ..high.b import B\n",                                    # climbs
        "low/c.py": "def f():\n    from . import d\n    return d\n",             # silent, closes c <-> d
        "low/d.py": "from .c import f\n",
        "low/e.py": "def f():\n    # the reason\n    from .d import f\n    import freetoken.low.c\n",
        "high/__init__.py": "",
        "high/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import g\nB = 1\n",
        "high/g.py": "from freetoken.high import b\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    assert climbs({"low": 1, "high": 2}, pkg) == [
        "low/a.py:1: low (layer 1) imports freetoken.high.b (layer 2)"]
    assert cycles(pkg) == [["freetoken.high.b", "freetoken.high.g"], ["freetoken.low.c", "freetoken.low.d"]]
    assert unexplained_local_imports(pkg) == [
        "low/c.py:2: imports freetoken.low.d inside a function without a reason"]
    assert {(i.src, i.dst) for i in imports(pkg) if i.type_only} == {("freetoken.high.b", "freetoken.high.g")}


if __name__ == "__main__":
    rank = layer_order() if "## Layers" in DOC.read_text() else {}
    edges: dict[tuple[str, str], int] = {}
    for i in imports():
        a, b = package(i.src), package(i.dst)
        if a != b:
            edges[a, b] = edges.get((a, b), 0) + 1
    for a in sorted(packages(), key=lambda p: (rank.get(p, 99), p)):
        outs = ", ".join(f"{b}({n})" for (x, b), n in sorted(edges.items()) if x == a)
        print(f"{rank.get(a, '?'):>2} {a:16} -> {outs}")
    print("\nclimbs:", *climbs(rank) or ["none"], sep="\n  ")
    print("\ncycles:", *[" <-> ".join(c) for c in cycles()] or ["none"], sep="\n  ")
    local = unexplained_local_imports()
    print(f"\nfunction-local imports without a reason: {len(local)}", *local, sep="\n  ")
