"""Sessions to token sequences, rendered exactly as the server renders a chat request
(freetoken/server/chat.py `render`, then the tokenizer), and the prefix-only ideal."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...server.chat import render
from ...server.errors import BadRequest
from .formats import Session, SessionError


@dataclass
class Turn:
    prompt_ids: list[int]
    output_ids: list[int]


def _output_text(tok, req, prompt: str, kwargs: dict) -> str:
    """What the model generated after `prompt`: the template's rendering of the history
    plus the response, past the prompt (closing whitespace after the end token dropped:
    the model stops at its end token)."""
    if req.response is None:
        return ""
    try:
        full = tok.apply_chat_template(req.messages + [req.response], tools=req.tools or None,
                                       add_generation_prompt=False, **kwargs)
    except Exception:  # noqa: BLE001 - a template may reject a trailing assistant turn
        full = None
    if full is not None and full.startswith(prompt):
        return full[len(prompt):].rstrip()
    r = req.response                       # the template edits the last turn: take its text as sent
    text = r.get("content") or ""
    if r.get("reasoning_content"):
        text = r["reasoning_content"] + "\n" + text
    return text


def render_session(tok, session: Session, template_kwargs: dict | None = None) -> list[Turn]:
    kwargs = dict(template_kwargs or {})
    turns = []
    for i, req in enumerate(session.requests):
        try:
            prompt = render(tok, req.messages, req.tools, kwargs)
        except BadRequest as e:
            raise SessionError(f"session {session.name}: request {i}: {e}") from None
        turns.append(Turn(tok.encode(prompt), tok.encode(_output_text(tok, req, prompt, kwargs))))
    return turns


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def prefix_ideal(turns: list[Turn]) -> list[int]:
    """Per request: prompt tokens that no earlier request's prompt or prompt+response
    shares as a prefix (what a cache holding everything, exactly, must still compute)."""
    seen: list[np.ndarray] = []
    out = []
    for t in turns:
        p = np.asarray(t.prompt_ids, dtype=np.int64)
        shared = max((common_prefix(p, s) for s in seen), default=0)
        out.append(len(p) - shared)
        seen.append(np.asarray(t.prompt_ids + t.output_ids, dtype=np.int64))
    return out
