"""The model serve/generate use without --model: the installed SmolLM2 package's GGUF, else
the random demo (also by name); the package is found without importing it."""
from __future__ import annotations

import sys

from freetoken import default_model
from freetoken.cli import terminal_safe


def test_choice(monkeypatch, tmp_path):
    monkeypatch.setattr(default_model, "installed_default", lambda: None)
    assert default_model.choose(None) == (None, "demo")
    assert default_model.choose("freetoken-demo") == (None, "demo")
    assert default_model.choose("x.gguf") == ("x.gguf", "given")
    f = tmp_path / default_model.FILE
    monkeypatch.setattr(default_model, "installed_default", lambda: f)
    assert default_model.choose(None) == (str(f), "default")
    assert default_model.choose("freetoken-demo") == (None, "demo")


def test_installed_default_is_found_without_importing(monkeypatch, tmp_path):
    pkg = tmp_path / default_model.PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('its dependencies are not installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(default_model.PACKAGE, None)
    assert default_model.installed_default() is None          # the package without its file
    (pkg / default_model.FILE).write_bytes(b"GGUF")
    assert default_model.installed_default() == pkg / default_model.FILE
    assert default_model.PACKAGE not in sys.modules


def test_terminal_safe_escapes_control_bytes():
    assert terminal_safe("a\x1b[2Jb\x07\nc\td") == "a\\x1b[2Jb\\x07\nc\td"
