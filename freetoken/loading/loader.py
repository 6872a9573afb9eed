"""Open a checkpoint and build its model with the engine's resolved settings, one way:
read the config -> build the model skeleton (dense modules, a seat for the experts) -> build the
expert pool (`build_pool`, re-encoded to `expert_format`; an FTW file's prebuilt one; the disk
tier: only where each expert lies in the file) -> build the experts backend the settings chose
-> attach it. The model never calls back into the loader, and no model file imports the config
or the experts backend builder."""
from __future__ import annotations

import dataclasses
import logging
import time

import torch

from ..config import EngineConfig, Settings
from ..models.context import BuildContext
from .experts_backend import backend_choice, build_disk_experts, build_experts
from .mtp_heads import load_mtp_heads
from ..experts.memory.pool import ExpertPool, requantize
from ..kernels.choices import kernel_variant
from ..kernels.pool import SPIN_US, shared_pool
from ..kernels.switch_set import SwitchSet, loading
from ..weights.source import open_checkpoint
from ..models import llama_numerics
from ..models.registry import model_class

log = logging.getLogger("freetoken.models")


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
    """The model skeleton: the checkpoint's model class constructed over `ck` (its dense modules,
    its MoE layers seated for experts not built yet)."""
    cls = model_class(ck.config, ck.dir / "config.json")
    model = cls(ck, BuildContext(cfg, spin_us, settings), max_len)
    if cfg.ggml_numerics == "llama-exact":      # llama.cpp's CPU arithmetic bit for bit (slow; a comparison tool)
        llama_numerics.apply(model)
    return model


def expert_pool(model, cfg: EngineConfig) -> ExpertPool:
    """The pool in its final layout: prebuilt by an FTW file, else `model.build_pool(ck)`
    re-encoded to `expert_format` (`reading("experts")` lets `freetoken convert` tell the expert
    tensors apart), `ck` the checkpoint as the model reads it."""
    ck = model.expert_checkpoint
    pool = ck.prebuilt_experts()
    if pool is None:
        with ck.reading("experts"):
            pool = with_format(model.build_pool(ck), cfg.expert_format)
    return pool


def attach_experts(model, cfg: EngineConfig, settings: Settings, spin_us: int = SPIN_US) -> dict:
    """Build the pool (or the disk tier's layout) and the experts backend the settings chose, and
    attach them to the model; returns what building found out (Settings fields)."""
    if settings.expert_tier == "disk":          # no pool: only where each expert lies in the file
        layout, experts, found = build_disk_experts(model, model.expert_checkpoint, cfg, spin_us, settings)
        model.attach_experts(layout, experts)
        return found
    pool = expert_pool(model, cfg)
    device = torch.device(cfg.torch_device)
    chosen = backend_choice(pool, cfg, device) if settings.moe_backend is None else {}   # no plan: the same rule
    experts, found = build_experts(pool, cfg, device, dataclasses.replace(settings, **chosen), spin_us=spin_us)
    model.attach_experts(pool, experts)
    return {**chosen, **found}


def load_model(cfg: EngineConfig, settings: Settings, timings: dict | None = None):
    """Returns (model, settings) built as `settings` (memory/resolve.py) say; the settings come
    back with what loading found out: the model's compute dtype (kernels.choices makes the
    final call once the kernels are built), `pinned` False, and -- when no plan chose them --
    the experts backend's choices. `timings`, when given, gets the seconds spent in
    "open" (an FTW file: header, reads started; a directory: its index), "build" (the model and
    experts backend; from a directory the weights are read here, from an FTW file the reads go
    on meanwhile) and "ready" (waiting for the rest of an FTW file's reads and checksums). The model
    keeps the kernel switches its choices set as its own (`model.kernel_switches`); the process's
    are the caller's again when this returns."""
    t0 = time.perf_counter()
    ck = open_checkpoint(cfg.model, cfg)
    t1 = time.perf_counter()
    try:
        with loading():     # the model's kernel choices in place while it builds, the caller's back after
            if settings.device.type == "cpu":   # the process's kernel pool, with the resolved spin time
                shared_pool(settings.num_threads, isa=kernel_variant(cfg.kernel_isa), spin_us=settings.spin_us)
            model = build_model(ck, cfg, settings.max_model_len, settings.spin_us, settings)
            found = attach_experts(model, cfg, settings, settings.spin_us) if model.experts is not None else {}
            if cfg.speculative == "mtp":
                model.mtp = load_mtp_heads(model, ck, cfg, settings, with_format)
            model.kernel_switches = SwitchSet.now()     # its own: installed by every step (kernels/switch_set.py)
        t2 = time.perf_counter()
        ck.close()                          # FTW: every byte in and verified before the model runs
    except BaseException:
        getattr(ck, "abandon", lambda: None)()
        raise
    if timings is not None:
        timings.update(open=t1 - t0, build=t2 - t1, ready=time.perf_counter() - t2)
    return model, dataclasses.replace(settings, compute_dtype=model.dtype, **found)
