"""The configuration `launch opencode` writes makes OpenCode compact before the next round can
overflow the window. OpenCode's rule, read from OpenCode 1.18.33's own code
(SessionCompaction.isOverflow and its `usable`): before each request it compacts once the
previous request's tokens (prompt + reply) reach

    usable = limit.input - (compaction.reserved ?? min(20000, maxOutput))   if limit.input
             context - maxOutput                                             otherwise
    maxOutput = min(limit.output, 32000) || 32000

so without limit.input a small output cap (256) leaves 256 tokens for the next user message:
the free run's round 8 then overflowed (our context_length_exceeded) before OpenCode compacted."""
from __future__ import annotations

import json

import pytest

from freetoken.cli.launch import Limits, agent_output, plan

OUTPUT_TOKEN_MAX = 32000       # OpenCode's default OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX


def opencode_usable(model: dict, cfg: dict) -> int:
    """OpenCode 1.18.33's compaction threshold for one model entry of its config."""
    limit = model["limit"]
    if limit["context"] == 0:
        return 0
    max_output = min(limit["output"], OUTPUT_TOKEN_MAX) or OUTPUT_TOKEN_MAX
    reserved = cfg.get("compaction", {}).get("reserved", min(20000, max_output))
    if limit.get("input"):
        return max(0, limit["input"] - reserved)
    return max(0, limit["context"] - max_output)


def written(tmp_path, context: int, cap: int | None) -> tuple[dict, dict]:
    limits = Limits("m", context, agent_output(context, cap))
    _, files, _ = plan("opencode", "http://127.0.0.1:1", limits, "k", tmp_path, [])
    cfg = json.loads(next(iter(files.values())))
    return cfg["provider"]["freetoken"]["models"]["m"], cfg


@pytest.mark.parametrize("context,cap", [(50000, 256), (50000, 512), (36000, None),
                                         (100000, 64), (4096, 512), (131072, None)])
def test_opencode_keeps_room_for_the_next_message(tmp_path, context, cap):
    model, cfg = written(tmp_path, context, cap)
    output = model["limit"]["output"]
    assert output == agent_output(context, cap)     # what it asks per reply: the server's cap
    usable = opencode_usable(model, cfg)
    assert 0 < usable < context
    room = context - usable
    assert room == min(context // 4, 20000) or room == output
    if cap:   # after a request just below the threshold, the bench's next message
        assert room >= output + context // 9          # (~window/9 tokens) and a capped reply fit
    else:
        assert room >= output


def test_the_old_config_left_no_room(tmp_path):
    """The configuration before this fix: limit.output = the server's cap, no limit.input."""
    old = {"limit": {"context": 50000, "output": 256}}
    assert 50000 - opencode_usable(old, {}) == 256           # < one ~5.6k-token user message
    model, cfg = written(tmp_path, 50000, 256)
    assert 50000 - opencode_usable(model, cfg) == 12500


@pytest.mark.parametrize("context", [32768, 36000])
def test_uncapped_threshold_is_unchanged(tmp_path, context):
    """Without a server cap, in windows up to ~36k, the threshold is context - reply budget as
    before the fix (where the scripted --long runs compacted) to within a quarter-window rule."""
    model, cfg = written(tmp_path, context, None)
    old = {"limit": {"context": context, "output": model["limit"]["output"]}}
    assert 0 <= opencode_usable(old, {}) - opencode_usable(model, cfg) <= 1000
