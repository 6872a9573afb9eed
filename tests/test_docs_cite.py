"""Every path and name that docs/architecture.md and README.md cite in backticks exists: a file
or folder (`experts/memory/pool.py`, `kernels/c/`, `dense.c`), a module's name (`experts/disk/plan.host_cache_slots`),
a dotted name under the package (`engine.LLMEngine.add_request`) or a class's member
(`ExpertPool.expert_nbytes`); and the map names every C kernel file. A moved module or a renamed
function shows up here instead of misleading the next reader.

`python tests/test_docs_cite.py` prints what is cited and missing."""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "freetoken"
DOCS = [REPO / "docs" / "architecture.md", REPO / "README.md"]
PATH_SUFFIXES = (".py", ".c", ".h", ".md", ".json", ".jinja", ".toml", ".sh")
ROOTS = (REPO, PKG, PKG / "kernels", PKG / "kernels" / "c")
SEARCHED = ("freetoken", "tests", "bench", "docs", "tools")       # where a bare file name may be

# Cited on purpose though not ours: what each is.
NOT_OURS = {
    "convert_hf_to_gguf.py": "llama.cpp's converter",
    "blobs/": "Ollama's store folder",
    "tokenizer.ggml.model": "a GGUF metadata key",
    "tokenizer.ggml.pre": "a GGUF metadata key",
}


def cited(doc: Path) -> list[str]:
    """Backticked spans outside fenced code blocks (commands and output are not citations)."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _top_names(path: Path) -> set[str]:
    out = set()
    for n in _tree(path).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                out |= {e.id for e in ast.walk(t) if isinstance(e, ast.Name)}
    return out


@lru_cache(maxsize=None)
def classes() -> dict[str, set[str]]:
    """Class name -> its members (methods, class attributes, fields, self.x assignments), over every
    class of that name in the package."""
    out: dict[str, set[str]] = {}
    for f in PKG.rglob("*.py"):
        for c in ast.walk(_tree(f)):
            if not isinstance(c, ast.ClassDef):
                continue
            members = out.setdefault(c.name, set())
            for n in ast.walk(c):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(n.name)
                elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    members.add(n.id)
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                    members.add(n.attr)
    return out


def _module_file(parts: list[str]) -> tuple[Path | None, list[str]]:
    """The deepest module the leading parts name under freetoken/, and the parts left."""
    here, found, rest = PKG, (PKG / "__init__.py", parts), parts
    for i, p in enumerate(parts):
        if (here / p / "__init__.py").exists():
            here = here / p
            found = (here / "__init__.py", parts[i + 1:])
        elif (here / f"{p}.py").exists():
            return here / f"{p}.py", parts[i + 1:]
        else:
            break
    return found if found[0] != PKG / "__init__.py" or parts[:1] == ["freetoken"] else (None, rest)


def _names_exist(module: Path, rest: list[str]) -> bool:
    """`rest` names something in `module`: a top-level name (of a package: of one of its modules,
    `engine.Scheduler`) and then a member of that class; or a member of a class the module
    defines (`llm.generate`: the `LLM` an `llm` variable holds)."""
    if not rest:
        return True
    modules = [module] + (sorted(module.parent.glob("*.py")) if module.name == "__init__.py" else [])
    for m in modules:
        if rest[0] in _top_names(m):
            return len(rest) == 1 or rest[1] in classes().get(rest[0], set())
    own = [n.name for n in _tree(module).body if isinstance(n, ast.ClassDef)]
    return len(rest) == 1 and any(rest[0] in classes()[c] for c in own)


def path_exists(token: str) -> bool:
    token = token.removeprefix("freetoken/")
    if any((root / token).exists() for root in ROOTS):
        return True
    if "/" not in token.rstrip("/"):                 # a bare file name: anywhere of ours
        return any(any((REPO / d).rglob(token.rstrip("/"))) for d in SEARCHED)
    return False


def check(token: str) -> str | None:
    """None when `token` is not a citation or what it cites exists; else why it does not."""
    t = token.strip().split("(")[0].split(" ")[0].rstrip(":,")
    if t in NOT_OURS:
        return None
    if not t or t.startswith(("/", "-", "$", "~", "http")) or "*" in t or "=" in t or "<" in t:
        return None
    if t.endswith(PATH_SUFFIXES) or t.endswith("/"):
        if t.startswith(("tests/", "bench/", "docs/", "tools/", "freetoken/")) or "/" in t or t.endswith(".py") \
                or t.endswith((".c", ".h")):
            return None if path_exists(t) else "no such file"
        return None
    if "/" in t:                                      # path.name: `experts/disk/plan.host_cache_slots`
        m = re.fullmatch(r"([\w/]+)\.(\w+(?:\.\w+)*)", t)
        if not m or not m.group(1).split("/")[0] in {p.name for p in PKG.iterdir()}:
            return None
        f = PKG / (m.group(1) + ".py")
        if not f.exists():
            return "no such module"
        return None if _names_exist(f, m.group(2).split(".")) else "no such name in that module"
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", t):
        return None
    parts = t.split(".")
    parts = parts[1:] if parts[0] == "freetoken" else parts
    if parts[0] in classes() and parts[0][0].isupper():
        return None if parts[1] in classes()[parts[0]] else "no such member"
    if (PKG / parts[0]).is_dir() or (PKG / f"{parts[0]}.py").exists():
        module, rest = _module_file(parts)
        if module is None:
            return None
        return None if _names_exist(module, rest) else "no such name"
    return None


def missing() -> list[str]:
    out = []
    for doc in DOCS:
        for token in cited(doc):
            why = check(token)
            if why:
                out.append(f"{doc.relative_to(REPO)}: `{token}`: {why}")
    return sorted(set(out))


def test_every_cited_path_and_name_exists():
    found = missing()
    assert not found, "cited but not there (moved or renamed?):\n" + "\n".join(found)


def test_the_map_names_every_c_kernel_file():
    text = (REPO / "docs" / "architecture.md").read_text()
    absent = [f.name for f in sorted((PKG / "kernels" / "c").iterdir())
              if f.suffix in (".c", ".h") and f"`{f.name}`" not in text and f"c/{f.name}`" not in text]
    assert not absent, f"docs/architecture.md, C kernels: not named: {absent}"


def test_the_checker_catches_what_it_should():
    assert check("experts/memory/pool.py") is None and check("experts/nothing_here.py") == "no such file"
    assert check("engine.LLMEngine.add_request") is None
    assert check("engine.LLMEngine.no_such_method") == "no such name"
    assert check("experts/disk/plan.host_cache_slots") is None
    assert check("experts/disk/plan.no_such_rule") == "no such name in that module"
    assert check("ExpertPool.no_such_member") == "no such member"
    assert check("torch.zeros") is None and check("/v1/memory") is None


if __name__ == "__main__":
    print(*missing() or ["every citation exists"], sep="\n")
