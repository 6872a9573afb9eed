"""Two-tier expert memory: the host pool (source of truth) and how experts are executed."""
from .base import Experts
from .memory.pool import ExpertPool, ExpertSpec

__all__ = ["Experts", "ExpertPool", "ExpertSpec"]
