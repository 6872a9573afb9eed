"""The real text of the quality bench: the docstrings (module, class, function) of a fixed list
of CPython standard-library modules, read from this interpreter's own installed sources with
`ast` (nothing imported, nothing downloaded), in file order, cut at `limit` characters. The
bench names the Python version, since the text follows it."""
from __future__ import annotations

import ast
import sys
import sysconfig
from pathlib import Path

MODULES = ("argparse", "collections/__init__", "dataclasses", "functools", "inspect", "json/__init__",
           "json/decoder", "logging/__init__", "pathlib", "shutil", "subprocess", "textwrap", "typing",
           "unittest/case", "urllib/parse", "email/message", "http/client", "asyncio/tasks", "difflib",
           "string", "tarfile", "zipfile/__init__", "datetime", "statistics", "fractions", "decimal",
           "heapq", "bisect", "calendar", "configparser", "csv", "enum", "glob", "gzip", "ipaddress",
           "locale", "mailbox", "optparse", "pickle", "pprint", "random", "sched", "smtplib", "socket",
           "sqlite3/__init__", "ssl", "tempfile", "threading", "timeit", "trace", "uuid", "warnings", "weakref")


def name() -> str:
    v = sys.version_info
    return f"CPython {v.major}.{v.minor}.{v.micro} standard-library docstrings ({len(MODULES)} modules)"


def stdlib_docstrings(limit: int = 300_000) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    for m in MODULES:
        f = root / f"{m}.py"
        if not f.is_file():
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    parts.append(doc.strip())
    text = "\n\n".join(dict.fromkeys(parts))      # each once, in order
    return text[:limit]


if __name__ == "__main__":
    t = stdlib_docstrings()
    print(name(), len(t), "characters", file=sys.stderr)
    sys.stdout.write(t)
