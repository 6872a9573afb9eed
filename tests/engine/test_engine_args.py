"""The engine flags come from EngineConfig's fields (engine/args.py reads each field's `Flag`).
The reference is the parser as it was written by hand before (issue 28): every flag it had keeps
its option string, dest, default, type, choices, help and metavar, and a sample argv parses to
the same `LLM(...)` options. A flag added later only needs its field; this reference stays as
it was."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from freetoken import defaults
from freetoken.config import EngineConfig, flag
from freetoken.engine.args import add_engine_args, engine_options
from freetoken.experts.base import BACKENDS
from freetoken.experts.formats import FORMAT_NAMES
from freetoken.experts.slots import DEFAULT_POLICY, POLICIES as CACHE_POLICIES


def hand_written_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--moe-backend", default="auto", choices=["auto", *BACKENDS])
    p.add_argument("--expert-cache-slots", type=int, default=None)
    p.add_argument("--expert-cache-gib", type=float, default=None)
    p.add_argument("--expert-cache-policy", default=None, metavar="POLICY",
                   help=f"expert cache replacement: {', '.join(CACHE_POLICIES)}, optionally +admit "
                        f"(admission control) and then +prefetch (next-layer prefetch); default {DEFAULT_POLICY}")
    p.add_argument("--expert-tier", default="auto", choices=["auto", "ram", "disk"],
                   help="disk: keep the expert pool in the model file behind a host cache (auto: when the "
                        "pool does not fit host memory, or --host-cache-gib/--host-cache-slots is given)")
    p.add_argument("--host-cache-gib", type=float, default=None, help="disk tier: host expert cache size")
    p.add_argument("--host-cache-slots", type=int, default=None, help="disk tier: host expert cache, whole experts")
    p.add_argument("--expert-format", default=None, choices=FORMAT_NAMES,
                   help="re-encode float experts at load (e.g. int8 ~ llama.cpp Q8_0)")
    p.add_argument("--dense-format", default=None, choices=["int8", "float"],
                   help="store attention/dense/lm_head weights as int8 (with --expert-format int8: a Q8_0-sized model); "
                        "float: dequantize a GGUF's quantized dense weights at load (default: kept packed)")
    p.add_argument("--prefill-gemm", default="auto", choices=["auto", "float32", "bfloat16", "amx", "vdpbf16ps"],
                   help="force the dtype prefill GEMMs over bf16 weights multiply in (auto: calibrated)")
    p.add_argument("--bf16-dot", default="auto", choices=["auto", "on", "off"],
                   help="force the vdpbf16ps dots with bf16-rounded activations on or off (auto: calibrated)")
    p.add_argument("--kernel-isa", default="auto", choices=["auto", "native", "avx2", "portable"],
                   help="force a C kernel build (auto: the widest this CPU runs)")
    p.add_argument("--record-routing", default=None, metavar="FILE", help="record every step's routing (JSONL)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="decode batches of up to the most sequences decoded together as CUDA graph replays (resident experts only; "
                        "off by default until checked on a real GPU)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help=f"context window (default: the checkpoint's, at most {defaults.MAX_MODEL_LEN})")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--verify", default="on", choices=["on", "off"],
                   help="FTW files: verify every tensor's checksum while reading (default on)")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache budget, prefix cache included (default: max_num_seqs x max_model_len "
                        f"tokens, at most {defaults.KV_CACHE_GIB:g} GiB)")
    p.add_argument("--memory-headroom-gib", type=float, default=None,
                   help="host memory the plan leaves to the rest of the machine (default "
                        f"max({100 // defaults.HOST_HEADROOM_DIVISOR}%%, {defaults.HOST_HEADROOM_GIB:g} GiB))")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="recompute every prompt from its first token (no KV/state reuse across requests)")
    p.add_argument("--state-checkpoints", type=int, default=16,
                   help="hybrid models: state snapshots kept per session for prefix reuse")
    p.add_argument("--state-cache-gib", type=float, default=None,
                   help="hybrid models: all state snapshots together (default: up to "
                        f"{defaults.STATE_CACHE_GIB:g}, as host memory allows)")


def hand_written_options(args) -> dict:
    return dict(dtype=args.dtype, device=args.device, moe_backend=args.moe_backend,
                expert_cache_slots=args.expert_cache_slots, expert_cache_gib=args.expert_cache_gib,
                expert_cache_policy=args.expert_cache_policy, expert_tier=args.expert_tier,
                host_cache_gib=args.host_cache_gib, host_cache_slots=args.host_cache_slots,
                max_model_len=args.max_model_len, num_threads=args.threads, expert_format=args.expert_format,
                dense_format=args.dense_format, record_routing=args.record_routing, kv_cache_gib=args.kv_cache_gib,
                prefix_cache=args.prefix_cache, state_checkpoints=args.state_checkpoints,
                state_cache_gib=args.state_cache_gib, verify_weights=args.verify == "on",
                memory_headroom_gib=args.memory_headroom_gib, prefill_gemm=args.prefill_gemm,
                bf16_dot=args.bf16_dot, kernel_isa=args.kernel_isa, cuda_graphs=args.cuda_graphs)


def _parsers():
    old, new = argparse.ArgumentParser(), argparse.ArgumentParser()
    hand_written_args(old)
    add_engine_args(new)
    return old, new


ATTRS = ("option_strings", "dest", "default", "type", "choices", "help", "metavar", "nargs", "const", "required")


def test_every_hand_written_flag_is_generated_unchanged():
    old, new = _parsers()
    generated = {s: a for a in new._actions for s in a.option_strings}
    for action in old._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        twin = generated.get(action.option_strings[0])
        assert twin is not None, f"{action.option_strings[0]} is no longer a flag"
        assert type(twin) is type(action), action.option_strings
        for attr in ATTRS:
            same = getattr(twin, attr), getattr(action, attr)
            if attr == "choices":          # a tuple or a list: argparse reads either
                same = tuple(same[0] or ()), tuple(same[1] or ())
            assert same[0] == same[1], (action.option_strings, attr)
    # argparse renders each option's line from these; equal lines, whatever the order
    lines = lambda p: sorted(" ".join(p.format_help().split("options:")[1].split()).split(" --"))
    assert lines(new) == lines(old)


SAMPLE = ["--dtype", "float16", "--device", "cpu", "--moe-backend", "hybrid", "--expert-cache-slots", "12",
          "--expert-cache-gib", "1.5", "--expert-cache-policy", "lfu+admit", "--expert-tier", "disk",
          "--host-cache-gib", "0.25", "--host-cache-slots", "7", "--expert-format", "int8", "--dense-format", "float",
          "--prefill-gemm", "float32", "--bf16-dot", "off", "--kernel-isa", "avx2", "--record-routing", "r.jsonl",
          "--cuda-graphs", "--max-model-len", "512", "--threads", "3", "--verify", "off", "--kv-cache-gib", "0.5",
          "--memory-headroom-gib", "2.5", "--no-prefix-cache", "--state-checkpoints", "4", "--state-cache-gib", "1"]


@pytest.mark.parametrize("argv", [[], SAMPLE], ids=["defaults", "every-flag"])
def test_a_sample_argv_gives_the_same_args_and_options(argv):
    old, new = _parsers()
    assert vars(new.parse_args(argv)) == vars(old.parse_args(argv))     # dests other code reads (args.threads)
    assert engine_options(new.parse_args(argv)) == hand_written_options(old.parse_args(argv))


def test_the_flag_defaults_are_the_fields_defaults():
    _, new = _parsers()
    assert EngineConfig(model="m", **engine_options(new.parse_args([]))) == EngineConfig(model="m")


@dataclasses.dataclass(frozen=True)
class Wider(EngineConfig):
    new_knob: int | None = flag(None, help="a new option")
    ratio: float = flag(0.5)
    switch_on: bool = flag(False)
    keep: bool = flag(True)
    plain_knob: int = 3                     # no flag


def test_a_field_with_a_flag_gets_one_and_a_field_without_none():
    p = argparse.ArgumentParser()
    add_engine_args(p, Wider)
    options = {s for a in p._actions for s in a.option_strings}
    assert {"--new-knob", "--ratio", "--switch-on", "--no-keep"} <= options
    unflagged = {f.name for f in dataclasses.fields(Wider) if "flag" not in f.metadata}
    assert {"model", "compute_dtype", "max_num_seqs", "seed", "plain_knob"} <= unflagged
    assert not {"--" + n.replace("_", "-") for n in unflagged} & options
    opts = engine_options(p.parse_args(["--new-knob", "5", "--ratio", "2", "--switch-on", "--no-keep"]), Wider)
    assert (opts["new_knob"], opts["ratio"], opts["switch_on"], opts["keep"]) == (5, 2.0, True, False)
    assert "plain_knob" not in opts
    assert Wider(model="m", **engine_options(p.parse_args([]), Wider)) == Wider(model="m")
    with pytest.raises(SystemExit):
        p.parse_args(["--plain-knob", "4"])
