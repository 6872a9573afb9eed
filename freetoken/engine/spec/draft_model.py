"""A separate small draft model with the target's tokenizer (`--speculative draft --draft-model
PATH`, also a candidate under `auto`): it runs its own paged KV, one shadow sequence per target
sequence, and proposes k tokens greedily.

Greedy drafts are exact under every sampling setting: the verifier's rule (verify.py) is the
speculative-sampling rule for a deterministic drafter (q one-hot on the drafted token), so
temperature, top-p and penalties keep their distribution with no q to carry.

The shadow's KV follows the target's tokens: before drafting, the tokens it has computed are
compared with the sequence's tokens now; everything past the first difference (drafted tokens
the verify rejected) is rolled back (`num_computed` moves back, whole blocks past it return to
the pool: the rows left behind are never read and are overwritten), then the new tokens run as
one chunk whose last row gives the first draft, and each further draft is one more position.

A model costs time to draft with, unlike a lookup: `seconds(k, behind)` (the catch-up of the
`behind` tokens it has not run, then k-1 single positions, from times measured online) is added
to the verify's price when the speculator prices a model drafter's k, before running it; once
drafted, that time is spent and the verify's price alone cuts the draft."""
from __future__ import annotations

import time

import torch

from ...errors import InvalidRequestError
from ...sampling_params import SamplingParams
from ..sequence import Sequence
from .drafters import Draft

CHUNK = 2048            # a catch-up longer than this (a first prompt) runs in chunks
EWMA = 0.2              # weight of the newest measurement in the cost estimates


def vocab_mismatch(target_tokenizer, draft_tokenizer) -> str | None:
    """Why the two tokenizers do not give the same ids to the same strings, or None."""
    a, b = target_tokenizer.hf.get_vocab(), draft_tokenizer.hf.get_vocab()
    if a == b:
        return None
    by_id_a = {i: t for t, i in a.items()}
    by_id_b = {i: t for t, i in b.items()}
    diff = sorted(i for i in set(by_id_a) | set(by_id_b) if by_id_a.get(i) != by_id_b.get(i))
    i = diff[0]
    return (f"{len(b)} tokens against the model's {len(a)}, {len(diff)} ids differ "
            f"(id {i}: {by_id_b.get(i)!r} against {by_id_a.get(i)!r})")


class DraftModelDrafter:
    name = "draft"

    def __init__(self, engine, target_tokenizer, target_vocab: int, path: str = ""):
        """`engine`: an LLMEngine of the draft checkpoint (speculation and prefix cache off):
        its model, runner and KV blocks are used here, its scheduler never."""
        why = vocab_mismatch(target_tokenizer, engine.tokenizer)
        if why is not None:
            raise InvalidRequestError(f"draft_model: {path}: its tokenizer differs from the model's ({why})")
        probe = engine.model.make_state()
        if probe is not None and probe.parts:
            raise InvalidRequestError(f"draft_model: {path}: a model with a recurrent or window state cannot "
                                      "draft (its state would need a snapshot per draft); use a plain decoder")
        self.engine, self.runner, self.blocks = engine, engine.runner, engine.blocks
        self.vocab = min(target_vocab, engine.model.vocab_size)
        self.max_len = engine.max_model_len
        self._seqs: dict = {}             # target sequence key -> its shadow, least recently drafted first
        self._params = SamplingParams(temperature=0.0)
        self.step_s: float | None = None   # seconds of a forward of one position
        self.row_s: float | None = None    # seconds per row of a catch-up chunk of several
        self.drafted = 0                   # positions run (for the statistics)
        self.rolled_back = 0               # computed rows given back after rejections
        self._warm_up()

    def _warm_up(self) -> None:
        """One short draft, forgotten: the first forwards pay one-time costs (kernel choices,
        allocations) that would make the measured price refuse every draft after them."""
        self.propose([0, 0], 2, key=("warm-up",))
        self.forget(("warm-up",))
        self.step_s = self.row_s = None
        self.drafted = 0
        self.runner.idle()      # it ran outside any step: torch's threads back (its decode left them at one)

    # --- the price ---------------------------------------------------------------------------
    def seconds(self, k: int, behind: int = 1) -> float:
        """Expected seconds to draft k tokens when the shadow is `behind` tokens behind (0 for
        k = 0); before any measurement 0, which lets drafting start (the verify's price decides
        then, and the measurement follows)."""
        if k <= 0:
            return 0.0
        step = self.step_s or 0.0
        row = self.row_s if self.row_s is not None else step
        return step + max(0, behind - 1) * row + (k - 1) * step

    def behind(self, key, n: int) -> int:
        """Tokens the key's shadow would run before its first draft for a context of n tokens
        (rejected drafts it still holds aside)."""
        s = self._seqs.get(key)
        return n if s is None else n - min(s.num_computed, n - 1)

    def _measure(self, attr: str, dt: float) -> None:
        old = getattr(self, attr)
        setattr(self, attr, dt if old is None else (1 - EWMA) * old + EWMA * dt)

    # --- the Drafter interface -----------------------------------------------------------------
    def observe(self, key, tokens: list[int], start: int = 0) -> None:
        """Nothing to index: the shadow catches up when it drafts."""

    def forget(self, key) -> None:
        s = self._seqs.pop(key, None)
        if s is not None:
            self.blocks.release(s)

    def propose(self, context: list[int], k: int, key=None) -> Draft | None:
        k = min(k, self.max_len - len(context))
        if k <= 0 or not context:
            return None
        s = self._shadow(key, context)
        if not self._room(s, len(context) + k - 1):
            return None
        tok = self._catch_up(s, context)
        out = [tok]
        for _ in range(k - 1):
            s.prompt_ids.append(tok)
            tok = self._next(s, 1)
            out.append(tok)
        s.prompt_ids.append(tok)           # the last draft: known, not yet computed
        return Draft(tuple(out), self.name, 0)

    # --- the shadow sequence -------------------------------------------------------------------
    def _shadow(self, key, context: list[int]) -> Sequence:
        """The key's shadow with its computed rows cut back to what `context` still agrees with."""
        s = self._seqs.pop(key, None)
        if s is None:
            s = Sequence(str(key), [], self._params, None, 0)
        self._seqs[key] = s                # most recently drafted last
        n = min(s.num_computed, len(context) - 1)      # the last token's row gives the first draft
        ids = s.prompt_ids
        if ids[:n] != context[:n]:
            n = next(i for i, (a, b) in enumerate(zip(ids, context)) if a != b)
        if n < s.num_computed:
            self.rolled_back += s.num_computed - n
            s.num_computed = n
            self.blocks.trim(s, n)
        s.prompt_ids = list(context)
        return s

    def _room(self, s: Sequence, tokens: int) -> bool:
        """Blocks for `tokens` rows, taken from the least recently drafted other shadows when the
        pool runs short (they catch up again when they next draft)."""
        for other_key in list(self._seqs):
            if self.blocks.can_allocate(s, tokens):
                break
            other = self._seqs[other_key]
            if other is not s and other.block_table:
                self.blocks.release(other)
                other.num_computed = 0
        if not self.blocks.can_allocate(s, tokens):
            return False
        self.blocks.allocate(s, tokens)
        return True

    def _catch_up(self, s: Sequence, context: list[int]) -> int:
        """Run the tokens the shadow has not computed (in chunks); the first draft."""
        while len(context) - s.num_computed > CHUNK:
            self._next(s, CHUNK)
        return self._next(s, len(context) - s.num_computed)

    @torch.inference_mode()
    def _next(self, s: Sequence, n: int) -> int:
        """Run the shadow's next n tokens; the argmax of the last row's logits."""
        t0 = time.perf_counter()
        logits, _, _ = self.runner.run([(s, n)])
        dt = time.perf_counter() - t0
        self._measure("step_s", dt) if n == 1 else self._measure("row_s", dt / n)
        s.num_computed += n
        self.drafted += n
        return int(torch.argmax(logits[0, :self.vocab]))

    def close(self) -> None:
        """The draft model's engine closes with the target's."""
        self.engine.close()

    def summary(self) -> dict:
        return {"per_token_s": self.step_s or 0.0, "catch_up_per_row_s": self.row_s or 0.0,
                "positions_run": self.drafted, "rows_rolled_back": self.rolled_back,
                "shadows": len(self._seqs)}
