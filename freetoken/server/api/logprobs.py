"""`logprobs` in the OpenAI shapes: the legacy completions object (`tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`; `echo` puts the prompt's tokens first, the
first with null) and chat's `logprobs.content` (token, logprob, bytes, top_logprobs). The
numbers come from engine/logprobs.py (the raw model's distribution)."""
from __future__ import annotations

import codecs
import math

from ...engine.logprobs import TokenLogprob
from ...sampling_params import MAX_TOP_LOGPROBS
from ..errors import BadRequest

NEG_INF = -9999.0           # what OpenAI reports for a token the model gives no probability


def _num(x: float) -> float:
    return x if math.isfinite(x) else NEG_INF


def check_top(k, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"{name}: expected an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}", param=name)
    return k


# echo with logprobs holds the prompt's float32 logits [prompt, vocab] until the request ends
# (the engine's want_prompt_logits, as LLM.score): bound them so one request cannot take the
# machine's memory (152k vocabulary: 3.5k prompt tokens; 49k: 10.9k)
MAX_ECHO_LOGITS_BYTES = 2 << 30


def check_echo_size(n_prompt: int, vocab: int) -> None:
    most = MAX_ECHO_LOGITS_BYTES // (4 * max(1, vocab))
    if n_prompt > most:
        raise BadRequest(f"echo with logprobs scores at most {most} prompt tokens with this model's "
                         f"{vocab}-token vocabulary (the prompt's logits are held in memory); the prompt "
                         f"has {n_prompt}", param="echo")


class TokenStrings:
    """Token id -> its bytes and the string OpenAI shows for it. The bytes are the token's
    own (llguidance's view of the vocabulary, which knows byte-level BPE and byte fallback);
    a token that is not whole UTF-8 shows as `bytes:\\xe2\\x80`, as OpenAI's tokens do."""

    def __init__(self, svc):
        try:
            self.lltok = svc.grammar_tokenizer()
        except ValueError:      # a tokenizer llguidance cannot read: each token's decoded text
            self.lltok = None
        self.tok = svc.tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, tid: int) -> tuple[str, bytes]:
        hit = self._cache.get(tid)
        if hit is None:
            if self.lltok is None or self.lltok.is_special_token(tid):
                s = self.tok.decode([tid])
                hit = (s, s.encode())
            else:
                b = bytes(self.lltok.decode_bytes([tid]))
                try:
                    hit = (b.decode("utf-8"), b)
                except UnicodeDecodeError:
                    hit = ("bytes:" + "".join(f"\\x{c:02x}" for c in b), b)
            self._cache[tid] = hit
        return hit


def completion_logprobs(strings: TokenStrings, entries: list[tuple[int, TokenLogprob | None]],
                        start_offset: int = 0) -> tuple[dict, int]:
    """The legacy object for (token id, its logprob or None) in order. `text_offset` counts
    characters of the decoded text from `start_offset` (the prompt's length without echo:
    offsets are into prompt + completion, as OpenAI's are). The top_logprobs of a token hold
    its k alternatives plus the token itself (so up to k + 1, as OpenAI documents). Also
    returns the offset after the last token (a stream's next chunk starts there)."""
    tokens, lps, tops, offsets = [], [], [], []
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    at = start_offset
    for tid, lp in entries:
        s, b = strings.get(tid)
        tokens.append(s)
        offsets.append(at)
        at += len(dec.decode(b))
        if lp is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(_num(lp.logprob))
        top = {strings.get(t)[0]: _num(v) for t, v in lp.top}
        top.setdefault(s, _num(lp.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, at


def chat_logprobs(strings: TokenStrings, entries: list[TokenLogprob], top_k: int) -> dict:
    """Chat's `logprobs` object: `content` with one entry per generated token."""
    def one(tid, lp):
        s, b = strings.get(tid)
        return {"token": s, "logprob": _num(lp), "bytes": list(b)}
    content = [{**one(e.token_id, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top[:top_k]]}
               for e in entries]
    return {"content": content, "refusal": None}
