"""Typed access to a checkpoint's config.json with one-line errors naming the field."""
from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from ..weights.validate import check_config

_MISSING = object()


class HFConfig:
    def __init__(self, data: dict, path: Path):
        self.data, self.path = data, path

    def get(self, name: str, default=None):
        v = self.data.get(name, default)
        return default if v is None else v

    def first(self, *names: str, default=_MISSING, kind=int):
        """The first of `names` present in the config, checked to be of `kind`."""
        for n in names:
            v = self.data.get(n)
            if v is not None:
                return self._check(n, v, kind)
        if default is _MISSING:
            raise CheckpointError(f"{self.path}: field {names[0]!r} is missing (expected {kind.__name__})")
        return default

    def req(self, name: str, kind=int):
        return self.first(name, kind=kind)

    def _check(self, name, v, kind):
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if kind is int and isinstance(v, bool) or not isinstance(v, kind):
            raise CheckpointError(f"{self.path}: field {name!r} is {v!r}, expected {kind.__name__}")
        if kind is int and v < 0:
            raise CheckpointError(f"{self.path}: field {name!r} is {v}, expected a non-negative int")
        check_config({name: v}, self.path)      # the field's range, before a size is taken from it
        return v
