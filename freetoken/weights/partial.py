"""A `.partial` file is what an interrupted `convert` (FTW) or `pull` (download) left behind:
name it as such, with the command that finishes it, instead of "not a checkpoint"."""
from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError

SUFFIX = ".partial"


def check_not_partial(path: Path) -> None:
    """Raise a CheckpointError when `path` is a `.partial` left by an interrupted write, or
    does not exist while its `.partial` does."""
    p = Path(path)
    if p.name.endswith(SUFFIX):
        raise CheckpointError(_message(p, p.name[: -len(SUFFIX)]))
    twin = p.with_name(p.name + SUFFIX)
    if not p.exists() and twin.exists():
        raise CheckpointError(_message(twin, p.name))


def _message(partial: Path, final_name: str) -> str:
    if final_name.endswith(".ftw"):
        return (f"{partial}: an incomplete conversion (`freetoken convert` was interrupted before "
                f"writing {final_name}): run convert again")
    return (f"{partial}: an incomplete download (interrupted before {final_name} was complete): "
            "run `freetoken pull` again, which resumes it")
