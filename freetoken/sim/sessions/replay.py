"""Feed rendered sessions through the engine's own prefix tree, scheduler and checkpoint
policy (`engine.prefix_replay.PrefixReplay`: no forward pass, nothing re-implemented) and
compare the tokens it re-prefills with the prefix-only ideal, per checkpoint policy."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...engine.prefix.replay import PrefixReplay
from .tokens import Turn, prefix_ideal

POLICIES = ("anchors", "periodic", "end")
POLICY_NOTES = {"anchors": "semantic anchors + prompt/request ends (FreeToken)",
                "periodic": "every 8192 tokens, newest 32 (llama.cpp)",
                "end": "end of each prompt and request only"}


@dataclass
class PolicyResult:
    computed: int = 0                 # prompt tokens the engine prefilled
    cached: int = 0
    checkpoints: int = 0              # live at the end of the session
    checkpoint_bytes: int = 0
    peak_checkpoint_bytes: int = 0
    per_request: list[int] = field(default_factory=list)


@dataclass
class SessionResult:
    name: str
    format: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    ideal: int
    ideal_per_request: list[int]
    policies: dict[str, PolicyResult]

    def ratio(self, policy: str) -> float:
        return self.policies[policy].computed / max(1, self.ideal)


def replay_turns(turns: list[Turn], *, policy: str, anchors, state_bytes: int, block_size: int,
                 num_blocks: int, state_checkpoints: int, state_cache_gib: float) -> PolicyResult:
    r = PrefixReplay(block_size=block_size, num_blocks=num_blocks, state_bytes=state_bytes, policy=policy,
                     state_checkpoints=state_checkpoints, state_cache_gib=state_cache_gib,
                     anchors=anchors if policy == "anchors" else None)
    out = PolicyResult()
    for t in turns:
        acc = r.request(t.prompt_ids, t.output_ids)
        out.computed += acc["computed_tokens"]
        out.cached += acc["cached_tokens"]
        out.per_request.append(acc["computed_tokens"])
        out.checkpoints = acc["checkpoints"]
        out.checkpoint_bytes = acc["checkpoint_bytes"]
        out.peak_checkpoint_bytes = max(out.peak_checkpoint_bytes, acc["checkpoint_bytes"])
    return out


def replay_session(name: str, fmt: str, turns: list[Turn], *, policies=POLICIES, **kw) -> SessionResult:
    ideal = prefix_ideal(turns)
    return SessionResult(name, fmt, len(turns), sum(len(t.prompt_ids) for t in turns),
                         sum(len(t.output_ids) for t in turns), sum(ideal), ideal,
                         {p: replay_turns(turns, policy=p, **kw) for p in policies})
