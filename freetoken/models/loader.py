"""Open a checkpoint and build its model with the engine's resolved settings.

The loader owns the wiring: a model builds its dense modules and, through `build_pool`, its
expert tensors as an `ExpertPool`; the loader re-encodes that pool to `expert_format` and
builds the experts backend. The model gets both through the `BuildContext` it is constructed
with (in place of the engine options), so no model file imports the config or the experts backend builder."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import torch

from ..config import EngineConfig, Settings
from .experts_backend import build_disk_experts, build_experts
from ..experts.pool import ExpertPool, requantize
from ..kernels.choices import kernel_variant
from ..kernels.pool import SPIN_US, shared_pool
from ..weights.source import open_checkpoint
from .registry import model_class

log = logging.getLogger("freetoken.models")


@dataclass(frozen=True)
class BuildContext:
    """What a model constructor reads from the engine options, plus `experts(model, ck)`, the
    loader's step that turns the model's expert tensors into (pool, experts backend) as the
    resolved `settings` say (None: tools such as `convert`, which choose by the same rule)."""
    cfg: EngineConfig
    spin_us: int = SPIN_US
    settings: Settings | None = None

    torch_device = property(lambda self: self.cfg.torch_device)
    torch_dtype = property(lambda self: self.cfg.torch_dtype)       # storage: embeddings, experts, KV
    compute_dtype = property(lambda self: self.cfg.compute_dtype)   # requested; kernels.choices decides
    dense_format = property(lambda self: self.cfg.dense_format)
    num_threads = property(lambda self: self.cfg.num_threads)
    prefill_gemm = property(lambda self: self.cfg.prefill_gemm)     # forced CPU choices, or "auto"
    bf16_dot = property(lambda self: self.cfg.bf16_dot)
    kernel_isa = property(lambda self: self.cfg.kernel_isa)

    def experts(self, model, ck):
        """The pool in its final layout -- prebuilt by an FTW file, else `model.build_pool(ck)`
        re-encoded to `expert_format` (`reading("experts")` lets `freetoken convert` tell the
        expert tensors apart) -- and the backend built over it."""
        disk = self.settings.expert_tier == "disk" if self.settings is not None else self.cfg.disk_tier
        if disk:                     # no pool: only where each expert lies in the file
            return build_disk_experts(model, ck, self.cfg, self.spin_us, self.settings)
        pool = ck.prebuilt_experts()
        if pool is None:
            with ck.reading("experts"):
                pool = with_format(model.build_pool(ck), self.cfg.expert_format)
        return pool, build_experts(pool, self.cfg, torch.device(self.cfg.torch_device), spin_us=self.spin_us,
                                   settings=self.settings)


def with_format(pool: ExpertPool, fmt: str | None) -> ExpertPool:
    """Float experts re-encoded to `fmt`; experts a checkpoint ships quantized (fp8, mxfp4,
    nvfp4) stay as shipped, which is what the memory plan counts (`memory.plan.expert_format`)."""
    if not fmt or pool.spec.fmt == fmt:
        return pool
    if pool.spec.fmt != "float":
        log.info("expert_format %s ignored: the checkpoint's experts are %s", fmt, pool.spec.fmt)
        return pool
    return requantize(pool, fmt)


def build_model(ck, cfg: EngineConfig, max_len: int, spin_us: int = SPIN_US, settings: Settings | None = None):
    """The checkpoint's model class constructed over `ck` with the loader's `BuildContext`."""
    cls = model_class(ck.config, ck.dir / "config.json")
    return cls(ck, BuildContext(cfg, spin_us, settings), max_len)


def load_model(cfg: EngineConfig, settings: Settings, timings: dict | None = None):
    """Returns (model, settings) built as `settings` (memory/resolve.py) say; the settings come
    back with what loading found out: the model's compute dtype (kernels.choices makes the
    final call once the kernels are built), `pinned` False, and -- when no plan chose them --
    the experts backend's choices. `timings`, when given, gets the seconds spent in
    "open" (an FTW file: header, reads started; a directory: its index), "build" (the model and
    experts backend; from a directory the weights are read here, from an FTW file the reads go
    on meanwhile) and "ready" (waiting for the rest of an FTW file's reads and checksums)."""
    t0 = time.perf_counter()
    ck = open_checkpoint(cfg.model, cfg)
    t1 = time.perf_counter()
    try:
        if settings.device.type == "cpu":   # the process's kernel pool, with the resolved spin time
            shared_pool(settings.num_threads, isa=kernel_variant(cfg.kernel_isa), spin_us=settings.spin_us)
        model = build_model(ck, cfg, settings.max_model_len, settings.spin_us, settings)
        t2 = time.perf_counter()
        ck.close()                          # FTW: every byte in and verified before the model runs
    except BaseException:
        getattr(ck, "abandon", lambda: None)()
        raise
    if timings is not None:
        timings.update(open=t1 - t0, build=t2 - t1, ready=time.perf_counter() - t2)
    experts = getattr(model, "experts", None)
    found = dict(getattr(experts, "settings", {}) or {})
    return model, dataclasses.replace(settings, compute_dtype=model.dtype, **found)
