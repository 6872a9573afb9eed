"""One resolve: the engine options made concrete for one checkpoint on one machine.

`resolve(cfg)` reads the checkpoint's shape (config.json, GGUF or FTW header) and what the
machine has (memory/probe.py), makes the memory plan (memory/plan.py) and returns `Settings`
(config.py) in blocks and slots: the engine allocates them, the loader builds the model and
experts backend with them, `freetoken plan` prints them. Nothing downstream decides again;
defaults come from defaults.py. The plan's table and warnings are logged here, once."""
from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path

from .. import defaults
from ..config import EngineConfig, Settings, activation_dtype_for, spin_us
from .model_size import ModelShape, read_model_shape
from .plan import MemoryPlan, make_plan
from .probe import MachineMemory, probe

log = logging.getLogger("freetoken.memory")


def resolve(cfg: EngineConfig, checkpoint: ModelShape | str | os.PathLike | None = None,
            machine: MachineMemory | None = None) -> Settings:
    """`checkpoint`: the model's shape or path (default `cfg.model`); `machine`: its memory
    (default: probed now)."""
    dev = cfg.torch_device
    try:
        shape = checkpoint if isinstance(checkpoint, ModelShape) else read_model_shape(checkpoint or cfg.model)
        settings, plan = make_plan(cfg, shape, machine or probe(dev.type, dev.index))
    except (TypeError, ValueError, KeyError, ZeroDivisionError, AttributeError, struct.error) as e:
        # a malformed config.json: the model loader reports it in one line naming the field
        plan = MemoryPlan(warnings=[f"no memory plan: config not understood ({type(e).__name__}: {e})"])
        settings = unplanned(cfg, plan)
    for w in plan.warnings:
        log.warning("memory plan: %s", w)
    if plan.items:
        log.info("memory plan:\n%s", plan.table())       # engine start: logged as a table
    return settings


def unplanned(cfg: EngineConfig, plan: MemoryPlan | None = None) -> Settings:
    """The options taken as they are, when no plan could be made: the engine counts KV blocks
    from the layers it built, the experts backend chooses with the same rule the plan uses."""
    return Settings(device=cfg.torch_device, dtype=cfg.torch_dtype, compute_dtype=activation_dtype_for(cfg),
                    max_model_len=cfg.max_model_len or defaults.max_model_len(_max_positions(cfg.model)),
                    max_num_batched_tokens=cfg.max_num_batched_tokens, kv_block_size=cfg.kv_block_size,
                    kv_blocks=None, state_cache_bytes=cfg.state_cache_bytes, num_threads=cfg.num_threads,
                    spin_us=spin_us(), expert_tier="disk" if cfg.disk_tier else "ram", max_num_seqs=cfg.max_num_seqs,
                    prefix_cache=cfg.prefix_cache, plan=plan)


def _max_positions(model: str) -> int | None:
    """config.json's max_position_embeddings when it can be read as a number, else None."""
    try:
        v = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
