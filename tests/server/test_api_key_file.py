"""serve --api-key-file / --admin-token-file / $FREETOKEN_API_KEY: the key off the command line;
every bad file is a one-line error naming the flag and the file."""
from __future__ import annotations

import argparse
import os

import pytest

from freetoken.cli.serve import register
from freetoken.server.guards.keys import resolve_keys


def serve_args(*argv):
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command"))
    return p.parse_args(["serve", *argv])


def resolved(*argv):
    args = serve_args(*argv)
    resolve_keys(args)
    return args


def one_line_error(*argv) -> str:
    with pytest.raises(SystemExit) as e:
        resolved(*argv)
    msg = str(e.value)
    assert msg.startswith("freetoken serve: ") and "\n" not in msg, msg
    return msg


def test_key_from_file_and_env(tmp_path, monkeypatch):
    f = tmp_path / "key"
    f.write_text("  k-123\n")
    monkeypatch.delenv("FREETOKEN_API_KEY", raising=False)
    assert resolved("--api-key-file", str(f)).api_key == "k-123"
    assert resolved().api_key is None
    monkeypatch.setenv("FREETOKEN_API_KEY", "from-env")
    monkeypatch.setenv("FREETOKEN_ADMIN_TOKEN", "adm")
    args = resolved()
    assert (args.api_key, args.admin_token) == ("from-env", "adm")
    assert resolved("--api-key-file", str(f)).api_key == "k-123"     # the file wins over the env
    f2 = tmp_path / "adm"
    f2.write_text("adm-2")
    assert resolved("--admin-token-file", str(f2)).admin_token == "adm-2"


def test_key_on_the_command_line_warns(caplog):
    with caplog.at_level("WARNING", logger="freetoken.server"):
        assert resolved("--api-key", "abc").api_key == "abc"
    assert "visible" in caplog.text and "abc" not in caplog.text


@pytest.mark.parametrize("content,needle", [("", "empty"), ("\n \n", "empty"), ("two\nlines", "one line"),
                                            (b"\xff\xfe", "UTF-8"), ("x" * 5000, "bytes")])
def test_bad_key_files(tmp_path, content, needle):
    f = tmp_path / "key"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    msg = one_line_error("--api-key-file", str(f))
    assert "--api-key-file" in msg and str(f) in msg and needle in msg, msg


def test_unreadable_missing_and_special_files(tmp_path):
    assert "cannot read" in one_line_error("--api-key-file", str(tmp_path / "nope"))
    assert "not a regular file" in one_line_error("--api-key-file", str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in one_line_error("--admin-token-file", str(fifo))
    if os.geteuid() != 0:
        f = tmp_path / "locked"
        f.write_text("k")
        f.chmod(0)
        assert "cannot read" in one_line_error("--api-key-file", str(f))
    f = tmp_path / "k"
    f.write_text("k")
    assert "not both" in one_line_error("--api-key", "x", "--api-key-file", str(f))
