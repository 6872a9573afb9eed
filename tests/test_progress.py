"""Progress of long steps (freetoken/progress.py): in a log (stderr not a terminal) one line per
~10% and no bar's carriage returns; a bar on a terminal and no log lines; nothing under --json.
The real steps report through it: convert, load, calibration, profile."""
from __future__ import annotations

import io
import logging

import pytest

from freetoken import progress as prog


@pytest.fixture
def mode(monkeypatch):
    monkeypatch.setattr(prog, "_mode", None)
    monkeypatch.setattr(prog, "DELAY_S", 0.0)      # the tests' steps are all instant
    monkeypatch.delenv("FREETOKEN_PROGRESS", raising=False)
    return monkeypatch


def test_a_step_done_within_the_delay_says_nothing(monkeypatch, caplog, capfd):
    """A small model's load: no lines in a log, no bar on a terminal (a one-line error stays one line)."""
    monkeypatch.setattr(prog, "_mode", None)
    monkeypatch.delenv("FREETOKEN_PROGRESS", raising=False)
    with caplog.at_level(logging.INFO, logger="freetoken.progress"), prog.progress(1000, "load q") as bar:
        for _ in range(10):
            bar.update(100)
    assert lines(caplog, "load q") == []


def lines(caplog, prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "freetoken.progress" and r.getMessage().startswith(prefix)]


def test_a_log_gets_one_line_per_tenth(mode, caplog, capfd):
    with caplog.at_level(logging.INFO, logger="freetoken.progress"), prog.progress(1000, "load x") as bar:
        for _ in range(250):
            bar.update(4)
    got = lines(caplog, "load x")
    assert len(got) == 10 and got[0].startswith("load x: 10%") and got[-1].startswith("load x: 100%")
    assert "B/s" in got[-1] and "ETA" in got[-1]
    assert "\r" not in capfd.readouterr().err                 # pytest's stderr is no terminal: no bar


def test_resumed_counts_start_where_they_are(mode, caplog):
    with caplog.at_level(logging.INFO, logger="freetoken.progress"), \
            prog.progress(100, "pull y", unit="steps", initial=55) as bar:
        for _ in range(45):
            bar.update(1)
    assert [m.split(":")[1].split("%")[0].strip() for m in lines(caplog, "pull y")] == \
        ["60", "70", "80", "90", "100"]


def test_a_terminal_gets_a_bar_and_no_log_lines(mode, caplog, monkeypatch):
    err = io.StringIO()
    err.isatty = lambda: True
    monkeypatch.setattr("sys.stderr", err)
    with caplog.at_level(logging.INFO, logger="freetoken.progress"), prog.progress(1000, "convert z") as bar:
        for _ in range(10):
            bar.update(100)
    assert "convert z" in err.getvalue() and "\r" in err.getvalue()
    assert lines(caplog, "convert z") == []


def test_off_is_silent_and_json_turns_it_off(mode, caplog, capsys, tiny_dir):
    from freetoken.cli import main
    d = tiny_dir("qwen3_moe")
    capsys.readouterr()                                          # making the fixture printed
    with caplog.at_level(logging.INFO, logger="freetoken.progress"):
        assert main(["generate", "--model", str(d), "--prompt", "hi", "--max-tokens", "2", "--dtype", "float32",
                     "--json"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("{") and err == "" and lines(caplog, "") == []
    mode.setattr(prog, "_mode", None)
    with caplog.at_level(logging.INFO, logger="freetoken.progress"):
        assert main(["generate", "--model", str(d), "--prompt", "hi", "--max-tokens", "2", "--dtype", "float32"]) == 0
    assert lines(caplog, f"load {d.name}")                      # the same load, reported without --json


def test_convert_and_load_report_in_the_log(mode, caplog, tiny_dir, tmp_path):
    from freetoken import LLM
    from freetoken.cli import main
    d = tiny_dir("qwen3_moe")
    out = tmp_path / "m.ftw"
    with caplog.at_level(logging.INFO, logger="freetoken.progress"):
        assert main(["convert", "--model", str(d), "--out", str(out)]) == 0
        LLM(str(out), dtype="float32").close()
    conv, load = lines(caplog, "convert -> m.ftw"), lines(caplog, "load m.ftw")
    assert 1 <= len(conv) <= 11 and conv[-1].startswith("convert -> m.ftw: 100%")
    assert 1 <= len(load) <= 11 and load[-1].startswith("load m.ftw: 100%")


def test_calibration_and_profile_report(mode, caplog, tmp_path):
    import torch

    from freetoken.experts.measure.probe import measure, synthetic_pool
    from freetoken.kernels.choices import prefill_gemm_choice
    with caplog.at_level(logging.INFO, logger="freetoken.progress"):
        prefill_gemm_choice("auto", torch.float32, kernels=True, flags=frozenset({"avx512_bf16"}), threads=1,
                            measure=lambda t: {"fp32": 2.0, "bf16": 1.0}, cache=tmp_path)
        prefill_gemm_choice("auto", torch.float32, kernels=True, flags=frozenset({"avx512_bf16"}), threads=1,
                            measure=lambda t: {"fp32": 2.0, "bf16": 1.0}, cache=tmp_path)     # cached: silent
        measure(synthetic_pool(64, 32, "fp32", 0.001), torch.device("cpu"), seconds=0.05, threads=1)
    assert len(lines(caplog, "calibrate gemm")) == 1
    assert [m.split("%")[0] for m in lines(caplog, "profile")] == ["profile B_P, B_H: 33", "profile B_P, B_H: 67",
                                                                  "profile B_P, B_H: 100"]
