"""Online acceptance statistics: for each drafter and confidence bucket, how often the i-th
drafted token is accepted given the ones before it were. The expected accepted length of a
k-token draft is sum_{i<=k} prod_{j<=i} a_j. Counts start from a prior (a few pseudo-trials)
and decay, so a workload that changes (a session turning from tool calls to prose) is
followed. Proposals the price did not draft are scored too, against the tokens the sequence
then emitted (`observe_shadow`, kept by shadow.py): without them a bucket the prior prices out
would never be tried, and a bucket that stopped paying would keep its old rates."""
from __future__ import annotations

PRIOR_FIRST = 0.4       # P(first drafted token accepted) before any evidence
PRIOR_NEXT = 0.75       # P(next accepted | the ones before were): accepted runs are long or short
PRIOR_WEIGHT = 0.5      # pseudo-trials of the prior: 2 kept sparse buckets (36 x K rates) at the prior too long
DECAY = 0.999           # per observed draft: about the last thousand drafts count
SPEED_DECAY = 0.995     # per step: about the last 200 steps set the run's speed
SPEED_PRIOR = 20.0      # steps at plain speed before any evidence


class AcceptanceStats:
    def __init__(self, max_draft: int):
        self.K = max_draft
        self._tried: dict[tuple[str, int], list[float]] = {}
        self._acc: dict[tuple[str, int], list[float]] = {}
        self.proposed: dict[str, int] = {}      # drafted tokens verified, per drafter
        self.accepted: dict[str, int] = {}      # of those, accepted
        self.drafts: dict[str, int] = {}        # verify steps with a draft, per drafter

    def _rows(self, drafter: str, bucket: int):
        key = (drafter, bucket)
        if key not in self._tried:
            self._tried[key] = [0.0] * self.K
            self._acc[key] = [0.0] * self.K
        return self._tried[key], self._acc[key]

    def rates(self, drafter: str, bucket: int) -> list[float]:
        """a_i for i = 1..K: P(token i accepted | tokens < i accepted)."""
        tried, acc = self._rows(drafter, bucket)
        out = []
        for i in range(self.K):
            prior = PRIOR_FIRST if i == 0 else PRIOR_NEXT
            out.append((acc[i] + PRIOR_WEIGHT * prior) / (tried[i] + PRIOR_WEIGHT))
        return out

    def expected_accepted(self, drafter: str, bucket: int, k_max: int) -> list[float]:
        """E[accepted tokens] of a draft of length k, for k = 0..k_max."""
        out, run, total = [0.0], 1.0, 0.0
        for a in self.rates(drafter, bucket)[:k_max]:
            run *= a
            total += run
            out.append(total)
        return out

    def all_accepted(self, drafter: str, bucket: int, k: int) -> float:
        """P(every token of a k-token draft is accepted)."""
        out = 1.0
        for a in self.rates(drafter, bucket)[:k]:
            out *= a
        return out

    def observe(self, drafter: str, bucket: int, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens of which the first `accepted` were accepted."""
        self.observe_shadow(drafter, bucket, drafted, accepted)
        self.proposed[drafter] = self.proposed.get(drafter, 0) + drafted
        self.accepted[drafter] = self.accepted.get(drafter, 0) + accepted
        self.drafts[drafter] = self.drafts.get(drafter, 0) + 1

    def observe_shadow(self, drafter: str, bucket: int, drafted: int, accepted: int) -> None:
        """A proposal of `drafted` tokens not verified, whose first `accepted` the sequence then
        emitted: the same evidence as a verify (a token equals the one decoding emits there
        exactly when the acceptance rule would take it: always for greedy, with probability p
        for sampling, as the draft is one token), left out of the per-drafter counts."""
        tried, acc = self._rows(drafter, bucket)
        for row in (tried, acc):
            for i in range(self.K):
                row[i] *= DECAY
        for i in range(min(drafted, accepted + 1, self.K)):
            tried[i] += 1
            if i < accepted:
                acc[i] += 1

    def summary(self) -> dict:
        """Per drafter: drafts, proposed and accepted tokens, mean accepted length per draft."""
        return {d: {"drafts": n, "proposed_tokens": self.proposed.get(d, 0),
                    "accepted_tokens": self.accepted.get(d, 0),
                    "mean_accepted_length": self.accepted.get(d, 0) / n if n else 0.0}
                for d, n in self.drafts.items()}



class Speedup:
    """The run's recent speed over plain decoding: tokens emitted per token plain steps would
    have emitted in the same (predicted) time. The price of a draft's seconds (decide.py)."""

    def __init__(self):
        self.tokens = self.plain = SPEED_PRIOR

    def step(self, plain_tokens: float, units: float) -> None:
        """A step that plain decoding would have made emit `plain_tokens`, predicted to take
        `units` of its plain tokens' time (plain_tokens x seconds / the step's plain seconds)."""
        self.tokens = self.tokens * SPEED_DECAY + plain_tokens
        self.plain = self.plain * SPEED_DECAY + units

    def accepted(self, n: int) -> None:
        """Drafted tokens a verify of the last step accepted: tokens emitted beyond plain's."""
        self.tokens += n

    @property
    def value(self) -> float:
        """At least plain's speed, which not drafting always reaches: drafts that failed lately
        must not make a drafted second look cheaper."""
        return max(1.0, self.tokens / self.plain)
