"""Loading a model: open the checkpoint, resolve the engine settings once, build the model's
dense modules, then turn the expert tensors it hands back (an `ExpertPool`) into the experts
backend. Model files know their architecture only: no model imports the config or the
experts factory."""
from __future__ import annotations

import dataclasses
import logging

from ..config import EngineConfig
from ..experts.base import Experts
from ..experts.factory import build_experts
from ..experts.pool import ExpertPool, requantize
from ..kernels.pool import shared_pool
from ..weights.checkpoint import Checkpoint
from .context import ModelOptions
from .registry import model_class

log = logging.getLogger("freetoken.loader")


def load_model(cfg: EngineConfig):
    """Returns (model, resolved settings)."""
    ck = Checkpoint(cfg.model)
    settings = cfg.resolve(ck.config)
    cls = model_class(ck.config, ck.dir / "config.json")
    chosen: dict = {}
    built: list[ExpertPool] = []

    def make_experts(pool: ExpertPool) -> Experts:
        if cfg.expert_format and pool.spec.fmt == "float":
            pool = requantize(pool, cfg.expert_format)
        experts = build_experts(pool, cfg, settings.device, spin_us=settings.spin_us)
        chosen.update(experts.settings)
        built.append(pool)
        return experts

    cpu = settings.device.type == "cpu"
    opts = ModelOptions(device=settings.device, dtype=settings.dtype, compute_dtype=settings.compute_dtype,
                        max_len=settings.max_model_len, dense_format=cfg.dense_format,
                        cpu_pool=shared_pool(settings.num_threads, spin_us=settings.spin_us) if cpu else None,
                        make_experts=make_experts)
    model = cls(ck, opts)
    model.pool = built[0] if built else None     # the host banks the experts backend serves from
    ck.close()
    return model, dataclasses.replace(settings, **chosen)

