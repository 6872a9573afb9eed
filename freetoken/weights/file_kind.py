"""What a file given as a model is when it is not a model file: a Git LFS pointer (the clone
lacks `git lfs pull`), an HTML page (a download saved the web page), other text, or empty; for
the one-line error that names it."""
from __future__ import annotations

from pathlib import Path


def describe(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if not head:
        return "an empty file"
    if head.startswith(b"version https://git-lfs.github.com/spec/"):
        return "a Git LFS pointer, not the file itself (run `git lfs pull` in its repository)"
    low = head.lstrip().lower()
    if low.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml")) or b"<html" in low[:200]:
        return "an HTML page, not a model file (the download saved a web page: use the file's direct link)"
    try:
        head.decode("utf-8")
        text = all(b >= 32 or b in (9, 10, 13) for b in head)
    except UnicodeDecodeError:
        text = False
    if text:
        return f"a text file starting {head[:40].decode('utf-8', 'replace')!r}, not a model file"
    return f"not a model file (it starts with bytes {head[:8].hex(' ')}; a GGUF starts with 'GGUF')"
