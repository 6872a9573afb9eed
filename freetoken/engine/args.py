"""The engine options as command-line flags (`freetoken generate`, `serve`, `check`, `plan`):
`add_engine_args(parser)` and, from the parsed flags, `engine_options(args)` for `LLM(...)`.
Both read the `Flag` that an `EngineConfig` field declares (config.py), so a field declared
with `flag(...)` is a flag and comes back under its field name."""
from __future__ import annotations

import argparse
import dataclasses
import typing

from ..config import EngineConfig, Flag


def flag_fields(config_class: type = EngineConfig) -> list[tuple[dataclasses.Field, Flag]]:
    """The fields that are flags, in declaration order (the help's order)."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(config_class) if "flag" in f.metadata]


def _option(f: dataclasses.Field, fl: Flag) -> str:
    switch_off = f.default is True and not fl.on_off
    return fl.option or ("--no-" if switch_off else "--") + f.name.replace("_", "-")


def _dest(f: dataclasses.Field, fl: Flag) -> str:
    """Where argparse puts the value: the field's name, or what a named option derives
    (`--threads` -> threads, `--verify` -> verify: other code reads those names on `args`)."""
    return fl.option.removeprefix("--").replace("-", "_") if fl.option else f.name


def _number_type(config_class: type, f: dataclasses.Field) -> type | None:
    """int or float for a field typed `int`, `float`, `int | None`, ...; None for strings."""
    hint = typing.get_type_hints(config_class)[f.name]
    kinds = set(typing.get_args(hint) or (hint,)) - {type(None)}
    return kinds.pop() if len(kinds) == 1 and kinds <= {int, float} else None


def _argparse_kwargs(config_class: type, f: dataclasses.Field, fl: Flag) -> dict:
    kw = {"dest": _dest(f, fl), "help": fl.help() if callable(fl.help) else fl.help}
    if fl.on_off:
        kw.update(default="on" if f.default else "off", choices=["on", "off"])
    elif isinstance(f.default, bool):
        kw["action"] = "store_false" if f.default else "store_true"
    else:
        kw["default"] = f.default
        if (kind := _number_type(config_class, f)) is not None:
            kw["type"] = kind
    if fl.choices is not None:
        kw["choices"] = list(fl.choices)
    if fl.metavar is not None:
        kw["metavar"] = fl.metavar
    return kw


def add_engine_args(p: argparse.ArgumentParser, config_class: type = EngineConfig,
                    help_for: dict[str, str] | None = None) -> None:
    """One argument per flag field (config_class: EngineConfig, or a subclass with more fields);
    `help_for`: {field name: help} where a verb explains a flag its own way."""
    for f, fl in flag_fields(config_class):
        kwargs = _argparse_kwargs(config_class, f, fl)
        if help_for and f.name in help_for:
            kwargs["help"] = help_for[f.name]
        p.add_argument(_option(f, fl), **kwargs)


def engine_options(args, config_class: type = EngineConfig) -> dict:
    """{field name: value} for every flag field, `on|off` flags as bools."""
    out = {}
    for f, fl in flag_fields(config_class):
        v = getattr(args, _dest(f, fl))
        out[f.name] = v == "on" if fl.on_off else v
    return out
