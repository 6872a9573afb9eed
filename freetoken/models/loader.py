"""Open a checkpoint and build its model."""
from __future__ import annotations

from ..config import EngineConfig
from ..weights.source import open_checkpoint
from .registry import model_class


def load_model(cfg: EngineConfig):
    """Returns (model, max_model_len)."""
    ck = open_checkpoint(cfg.model, cfg)
    cls = model_class(ck.config, ck.dir / "config.json")
    max_pos = ck.config.get("max_position_embeddings") or 32768
    max_len = cfg.max_model_len or min(int(max_pos), 32768)
    model = cls(ck, cfg, max_len)
    ck.close()
    return model, max_len
