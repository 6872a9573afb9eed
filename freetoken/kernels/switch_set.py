"""Kernel switches as a value an engine owns.

The C kernels read their switches (c/switches.c: the bf16 dots, the GEMM / GEMV / attention tiles,
the ggml activation rounding and per-256 k-quants, ...) from process-wide globals, and the torch
expert executors read two records of them (`EXECUTOR_RECORDS`). An engine's load applies its
choices (kernels/choices.py) inside `loading()`, keeps the result as its `SwitchSet`
(loading/loader.py) and puts the caller's switches back; every entry of the engine into the
kernels (LLMEngine.step, ModelRunner.run) runs inside `installed()`, which swaps its values in and
the caller's back after (one ft_switches call per loaded library each way). So engines in one
process compute each with its own choices, and raw kernel calls outside an engine see the
process's own switches (as built, unless the caller set them).

One lock, held from install to restore (and through a load), keeps other threads' engines out
meanwhile: the switches are global, two steps at once would mix them."""
from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager

from . import switch_libraries, read_switches

# The torch expert executors' records of two switches (experts/execution/numerics.py reads them):
# the bf16 dots on, and the token count from which the experts' GEMM tiles round (0: off).
EXECUTOR_RECORDS = {"bf16_dot": False, "tiles_min": 0}

_lock = threading.RLock()
_stack: list = []       # (the set in place or None while loading, what installing it replaced), innermost last
_built: dict = {}       # variant -> its as-built values as a C array


def _c_array(values) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


def _as_built(variant: str, values: tuple[int, ...]) -> ctypes.Array:
    if variant not in _built:
        _built[variant] = _c_array(values)
    return _built[variant]


class SwitchSet:
    """Every loaded library's switches and the executors' records, as one value (an engine's)."""

    __slots__ = ("arrays", "records", "_c", "_plan", "_swapped_in")

    def __init__(self, arrays: dict[str, tuple[int, ...]], records: tuple[bool, int]):
        self.arrays, self.records = arrays, records
        self._c = {variant: _c_array(vals) for variant, vals in arrays.items()}
        self._plan: list = []           # [(library, this set's values, a buffer for the caller's)]
        self._swapped_in = 0            # how many of this set's installs hold the plan's buffers

    @classmethod
    def now(cls) -> SwitchSet:
        """The process's switches as they are. Under the lock: while another thread's engine steps,
        its set is in place, and a snapshot then would take that set for the process's."""
        with _lock:
            return cls({variant: read_switches(lib) for variant, (lib, _) in switch_libraries().items()},
                       (EXECUTOR_RECORDS["bf16_dot"], EXECUTOR_RECORDS["tiles_min"]))

    def __eq__(self, other) -> bool:
        return isinstance(other, SwitchSet) and self.arrays == other.arrays and self.records == other.records

    __hash__ = None

    def __repr__(self) -> str:
        return f"SwitchSet({self.arrays}, bf16_dot={self.records[0]}, tiles_min={self.records[1]})"

    def _values_for(self, variant: str, built: tuple[int, ...]) -> ctypes.Array:
        """This set's values for a library; one loaded after the set was taken: its values as built."""
        mine = self._c.get(variant)
        return mine if mine is not None else _as_built(variant, built)

    def _swap_plan(self) -> list:
        """(library, values, buffer) per loaded library, made again when one more has loaded; fresh
        buffers where this set is already swapped in further out (a nest A -> B -> A)."""
        libs = switch_libraries()
        if len(self._plan) != len(libs) or self._swapped_in:
            plan = [(lib, self._values_for(v, built), (ctypes.c_int * len(built))()) for v, (lib, built) in libs.items()]
            if self._swapped_in:
                return plan
            self._plan = plan
        return self._plan

    def put(self) -> None:
        """Write these values into the process (what the test guard and a finished load do); under
        the lock, so never into another thread's step."""
        with _lock:
            for variant, (lib, built) in switch_libraries().items():
                lib.ft_switches(None, self._values_for(variant, built))
            EXECUTOR_RECORDS["bf16_dot"], EXECUTOR_RECORDS["tiles_min"] = self.records

    def installed(self) -> SwitchSet:
        """`with engine_set.installed():` these values in place for the block, the caller's after."""
        return self

    def __enter__(self) -> SwitchSet:
        _lock.acquire()
        top = _stack[-1][0] if _stack else None
        if top is self or (top is not None and top == self):    # nested in the same values: nothing to swap
            _stack.append((self, None))
            return self
        plan = self._swap_plan()
        for lib, mine, old in plan:
            lib.ft_switches(old, mine)              # the caller's values out, this set's in: one call
        records = EXECUTOR_RECORDS["bf16_dot"], EXECUTOR_RECORDS["tiles_min"]
        EXECUTOR_RECORDS["bf16_dot"], EXECUTOR_RECORDS["tiles_min"] = self.records
        self._swapped_in += 1
        _stack.append((self, (plan, records)))
        return self

    def __exit__(self, *exc) -> None:
        _, replaced = _stack.pop()
        try:
            if replaced is not None:
                plan, records = replaced
                self._swapped_in -= 1
                for lib, _, old in plan:
                    lib.ft_switches(None, old)
                EXECUTOR_RECORDS["bf16_dot"], EXECUTOR_RECORDS["tiles_min"] = records
        finally:
            _lock.release()


def require_loading(what: str) -> None:
    """Raises unless this thread is inside `loading()`: a model's choices go into the process
    switches only there, so no build outside a load leaves them behind for later kernel calls."""
    with _lock:     # re-entrant: the loading thread holds it; any other thread waits, then sees none
        if not (_stack and _stack[-1][0] is None):
            raise RuntimeError(f"{what} applies a model's kernel choices: build it inside "
                               "kernels.switch_set.loading() (loading/loader.py does)")


@contextmanager
def loading():
    """An engine's load: its choices go into the process switches while it builds (and calibrates),
    the caller's come back after (a library first loaded meanwhile: its values as built). Yields
    nothing; the loader takes `SwitchSet.now()` as the engine's own before the block ends."""
    with _lock:
        caller = SwitchSet.now()
        _stack.append((None, None))
        try:
            yield
        finally:
            _stack.pop()
            caller.put()
