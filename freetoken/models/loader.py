"""Open a checkpoint, resolve the engine settings once, and build its model."""
from __future__ import annotations

import dataclasses

from ..config import EngineConfig
from ..kernels.pool import shared_pool
from ..weights.source import open_checkpoint
from .registry import model_class


def load_model(cfg: EngineConfig):
    """Returns (model, resolved settings)."""
    ck = open_checkpoint(cfg.model, cfg)
    settings = cfg.resolve(ck.config)
    cls = model_class(ck.config, ck.dir / "config.json")
    if settings.device.type == "cpu":   # the process's kernel pool, with the resolved spin time
        shared_pool(settings.num_threads, spin_us=settings.spin_us)
    model = cls(ck, cfg, settings.max_model_len)
    ck.close()
    experts = getattr(model, "experts", None)
    chosen = dict(getattr(experts, "settings", {}) or {})
    return model, dataclasses.replace(settings, compute_dtype=model.dtype, **chosen)
