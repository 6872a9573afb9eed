"""Where hybrid models snapshot their recurrent/sliding-window state, and which snapshots stay.

A request resumes from the deepest checkpoint at or before the point where its history first
differs from a cached one, so checkpoints belong just before the blocks agents edit: turn
boundaries, thinking segments, tool calls and tool outputs (the `anchors`, found from the
tokenizer's special tokens and the chat template), the end of every prompt (the next turn
appends after it) and the end of every request. A long stretch without anchors gets one every
`period` tokens.

Kinds:
- "anchors": the above (the default);
- "periodic": llama.cpp's rule, every `period` tokens (8192) plus the end of the prompt,
  newest 32 per session;
- "end": only the end of each prompt and of each request.

Per session (one root-to-leaf path of the prefix tree) at most `per_session` checkpoints are
kept: the newest half always (agents edit recent history far more often than old history);
of the older ones, those no later request resumed from and that no fork shares go first,
shallowest first (a checkpoint a request already resumed from, or that sits where
histories fork, is the one the next edit will need again).
"""
from __future__ import annotations

KINDS = ("anchors", "periodic", "end")


class CheckpointPolicy:
    def __init__(self, kind: str = "anchors", anchors=None, per_session: int = 16,
                 period: int | None = None, min_gap: int = 32):
        if kind not in KINDS:
            raise ValueError(f"checkpoint policy: expected one of {KINDS}, got {kind!r}")
        if per_session < 1:
            raise ValueError(f"state_checkpoints: expected at least 1, got {per_session}")
        self.kind = kind
        self.anchors = anchors if kind == "anchors" else None    # .positions(token_ids, start) -> [int]
        self.per_session = per_session
        self.period = period or (8192 if kind == "periodic" else 2048)
        self.min_gap = min_gap

    @classmethod
    def llama_cpp(cls) -> "CheckpointPolicy":
        return cls("periodic", per_session=32, period=8192)

    def plan(self, token_ids, start: int, prompt_len: int) -> list[int]:
        """Sorted positions in (start, prompt_len] to snapshot while prefilling this prompt."""
        if prompt_len <= start:
            return []
        chosen: list[int] = []
        if self.kind != "end":
            marks = self.anchors.positions(token_ids[:prompt_len], start) if self.anchors is not None else []
            last = start
            for p in _cluster_ends(sorted(m for m in set(marks) if start < m < prompt_len), self.min_gap) + [prompt_len]:
                while p - last > self.period:                # anchor-free stretch: periodic fallback
                    last += self.period
                    chosen.append(last)
                chosen.append(p)
                last = p
        if not chosen or chosen[-1] != prompt_len:
            chosen.append(prompt_len)
        return chosen

    def to_drop(self, on_path, shared) -> list:
        """[(node, checkpoint)] on one path -> those to drop to keep `per_session`.
        `shared(node)` is true where histories fork below that node. The newest half of the
        budget is always kept; of the older ones, those no request resumed from and no fork
        shares go first, shallowest first."""
        excess = len(on_path) - self.per_session
        if excess <= 0:
            return []
        by_position = sorted(on_path, key=lambda nc: nc[1].position)
        older = by_position[:len(by_position) - (self.per_session + 1) // 2]
        ranked = sorted(older, key=lambda nc: (nc[1].hits > 0 or shared(nc[0]), nc[1].position))
        return ranked[:excess]


def _cluster_ends(marks: list[int], gap: int) -> list[int]:
    """Anchors come in clusters (`<|im_end|>`, `<|im_start|>user`, `<tool_response>` a few
    tokens apart): of each run spanning less than `gap` tokens keep the last, the one right
    before the content an agent edits."""
    kept, first = [], None
    for i, p in enumerate(marks):
        first = p if first is None else first
        if i + 1 < len(marks) and marks[i + 1] - first < gap:
            continue
        kept.append(p)
        first = None
    return kept
