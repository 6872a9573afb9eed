"""The engine flags come from EngineConfig's fields (engine/args.py reads each field's `Flag`):
every flag field is a flag, and a value given on the command line comes back under its field's
name (a number as a number, `on|off` and switches as bools, a choice as itself), one flag at a
time and all together; with no flags the options are the fields' defaults."""
from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from freetoken.config import EngineConfig, flag
from freetoken.engine.args import add_engine_args, engine_options, flag_fields


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return p


def _option_of(f: dataclasses.Field, fl) -> str:
    if fl.option:
        return fl.option
    return ("--no-" if f.default is True and not fl.on_off else "--") + f.name.replace("_", "-")


def _given(f: dataclasses.Field, fl) -> tuple[list[str], object]:
    """(argv that sets the field to a value other than its default, that value)."""
    opt = _option_of(f, fl)
    if fl.on_off:
        return [opt, "off" if f.default else "on"], not f.default
    if isinstance(f.default, bool):
        return [opt], not f.default
    if fl.choices:
        value = next(c for c in fl.choices if c != f.default)
        return [opt, value], value
    hint = typing.get_type_hints(EngineConfig)[f.name]
    kinds = set(typing.get_args(hint) or (hint,)) - {type(None)}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind is int:
        return [opt, "7"], 7
    if kind is float:
        return [opt, "2.5"], 2.5
    return [opt, "some-value"], "some-value"


FLAGS = flag_fields()


def test_every_flag_field_is_one_flag():
    options = [s for a in _parser()._actions for s in a.option_strings if s not in ("-h", "--help")]
    assert sorted(options) == sorted(_option_of(f, fl) for f, fl in FLAGS)
    assert len(FLAGS) >= 20


@pytest.mark.parametrize("field,fl", FLAGS, ids=[f.name for f, _ in FLAGS])
def test_each_flag_parses_to_its_field(field, fl):
    argv, value = _given(field, fl)
    opts = engine_options(_parser().parse_args(argv))
    assert opts[field.name] == value and type(opts[field.name]) is type(value), (argv, opts[field.name])
    defaults = engine_options(_parser().parse_args([]))
    assert {k: v for k, v in opts.items() if k != field.name} == {k: v for k, v in defaults.items() if k != field.name}


def test_every_flag_at_once():
    argv, want = [], {}
    for f, fl in FLAGS:
        a, v = _given(f, fl)
        argv += a
        want[f.name] = v
    assert engine_options(_parser().parse_args(argv)) == want


def test_the_flag_defaults_are_the_fields_defaults():
    assert EngineConfig(model="m", **engine_options(_parser().parse_args([]))) == EngineConfig(model="m")


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
