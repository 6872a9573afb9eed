import argparse
import contextlib
import io
from pathlib import Path

import pytest

from helpers import SHARED_DATA

TRACES = SHARED_DATA / "routing-traces"


@pytest.fixture
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"shared routing traces not found at {TRACES} (evaluation data, not shipped with the repo)")
    return TRACES


@pytest.fixture
def run_sim():
    """Run `freetoken sim ...` through register(); returns (exit code, stdout, stderr)."""
    from freetoken.sim import cli

    def run(*argv: str):
        parser = argparse.ArgumentParser(prog="freetoken")
        cli.register(parser.add_subparsers(dest="command"))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(["sim", *argv])
            code = args.func(args)
        return code, out.getvalue(), err.getvalue()

    return run
