"""Recorded agent sessions -> the exact requests the agent sent, rendered to tokens, and
replayed through the engine's prefix cache (`freetoken sim sessions`)."""
from .formats import Request, Session, SessionError
from .read import read_sessions

__all__ = ["Request", "Session", "SessionError", "read_sessions"]
