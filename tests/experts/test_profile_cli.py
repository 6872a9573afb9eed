"""`freetoken profile` writes a profile the factory then loads for this machine/device/format."""
import argparse
import json

import torch
from tiered_helpers import one_torch_thread  # noqa: F401

from freetoken.experts.measure.bandwidth import device_id, format_id, load_profile, machine_id
from freetoken.cli.profile import model_format, register
from freetoken.experts.measure.probe import synthetic_pool


def parse(argv):
    parser = argparse.ArgumentParser(prog="freetoken")
    register(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(argv)


def test_profile_writes_a_loadable_entry(tmp_path, capsys):
    out = tmp_path / "bw.json"
    args = parse(["profile", "--hidden", "64", "--intermediate", "32", "--format", "fp32", "--pool-gib", "0.005",
                  "--seconds", "0.05", "--device", "cpu", "--link-gbs", "0.5", "--out", str(out), "--threads", "1"])
    assert args.func(args) == 0
    entry = next(iter(json.loads(out.read_text())["profiles"].values()))
    assert entry["b_p"] <= 0.5e9 * 1.05          # the paced link can never go faster than its pace
    assert entry["b_h"] > 0 and entry["b_h_shared"] > 0 and entry["expert_nbytes"] == 3 * 64 * 32 * 4
    pool = synthetic_pool(64, 32, "fp32", 0.005)
    prof = load_profile(out, machine_id(), device_id(torch.device("cpu")), format_id(pool))
    assert prof is not None and prof.b_p == entry["b_p"]
    assert "B_P" in capsys.readouterr().out


def test_model_format(tiny_dir):
    assert model_format(tiny_dir("qwen3_moe"))[2] in ("fp32", "bf16")
    assert model_format(tiny_dir("gpt_oss_mxfp4"))[2] == "mxfp4"


def test_profile_measures_pageable_copies_when_pinning_is_refused(caplog):
    """`profile` on CUDA pins the test pool through pinning.py's fallback: a refused pin (a fake
    that fails) gives one warning and a profile of pageable copies, not a traceback."""
    import logging

    from freetoken.experts.memory.pinning import PinError
    from freetoken.experts.measure.probe import measure

    def refuse():
        raise PinError("cudaHostRegister failed (1)")
    pool = synthetic_pool(64, 32, "fp32", 0.002)
    with caplog.at_level(logging.WARNING, logger="freetoken.experts"):
        prof = measure(pool, torch.device("cpu"), seconds=0.02, threads=1, pin=refuse)
    assert prof.b_p > 0 and prof.b_h > 0
    assert sum("cannot pin" in r.getMessage() for r in caplog.records) == 1


def test_profile_measures_b_d_on_a_given_file(tmp_path):
    data = tmp_path / "model.bin"
    data.write_bytes(bytes(range(256)) * (16 << 10))        # 4 MiB
    out = tmp_path / "bw.json"
    args = parse(["profile", "--hidden", "64", "--intermediate", "32", "--format", "fp32", "--pool-gib", "0.005",
                  "--seconds", "0.05", "--device", "cpu", "--out", str(out), "--threads", "1",
                  "--disk-file", str(data)])
    assert args.func(args) == 0
    entry = next(iter(json.loads(out.read_text())["profiles"].values()))
    assert entry["b_d"] > 0
    prof = load_profile(out, machine_id(), "cpu", "other-format")      # B_D does not depend on the format
    assert prof is not None and prof.b_d == entry["b_d"]
    from freetoken.experts.measure.diskbw import DEPTHS          # the reads in flight measured best, and how
    assert entry["disk_queue_depth"] in DEPTHS and prof.disk_queue_depth == entry["disk_queue_depth"]
    assert entry["disk_direct"] in (True, False)
