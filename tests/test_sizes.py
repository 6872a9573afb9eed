"""A reader takes in a function and a folder at a glance: no function in freetoken/ over 80
lines, no folder with more than 15 modules (split into rooms instead; tools/restructure.py)."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "freetoken"
MAX_FUNCTION_LINES, MAX_MODULES = 80, 15


def long_functions(root: Path = PKG) -> list[str]:
    out = []
    for f in sorted(root.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES:
                out.append(f"{f.relative_to(root.parent)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)")
    return out


def wide_folders(root: Path = PKG) -> list[str]:
    count = Counter(f.parent for f in root.rglob("*.py"))
    return [f"{d.relative_to(root.parent)}: {n} modules" for d, n in sorted(count.items()) if n > MAX_MODULES]


def test_no_function_over_80_lines():
    assert not long_functions(), "split these:\n" + "\n".join(long_functions())


def test_no_folder_over_15_modules():
    assert not wide_folders(), "put these in rooms:\n" + "\n".join(wide_folders())


def test_the_checks_see_what_they_count(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("def f():\n" + "    x = 1\n" * 85)
    for i in range(16):
        (tmp_path / "pkg" / f"m{i}.py").write_text("")
    assert long_functions(tmp_path / "pkg") == ["pkg/long.py:1 f (86 lines)"]
    assert wide_folders(tmp_path / "pkg") == ["pkg: 17 modules"]
