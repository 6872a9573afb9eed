"""Semantic anchors: the token positions just before the blocks agents edit.

Agents rewrite their history at block boundaries: they strip old thinking, replace old
tool outputs, keep the last n observations, re-render a system prompt. A state
checkpoint at such a boundary (the state after tokens[:p]) lets a later request that
shares the prefix up to p resume there. The markers are found from the checkpoint's own
files, not from a list for one family:

- the special/added tokens and tag-like strings that appear in the chat template's
  source or in what it renders for a probe conversation (so markers built inside the
  template, e.g. DeepSeek's `'<' + dsml_token + 'tool_calls>'`, are found too), and the
  one family of markers that are not tag-like (MiniMax-M2's `]~b]` / `[e~[` role brackets),
- plus the vocabulary's think/tool tokens (the model may emit them unprompted).

Each marker has a kind (turn, think, tool_call, tool_output) and a side: an opening
marker anchors before itself, a closing marker just after itself. Markers are matched
on the bytes the tokens spell, so multi-token markers work as well as single tokens;
the anchor is at the boundary of the token holding the marker's first (last) byte."""
from __future__ import annotations

import bisect
import re
from typing import NamedTuple

KINDS = ("turn", "think", "tool_call", "tool_output")


class Anchor(NamedTuple):
    pos: int        # checkpoint position: the state after tokens[:pos]
    kind: str       # one of KINDS
    marker: str     # the marker text that put it there


class Marker(NamedTuple):
    text: str
    kind: str
    closing: bool


# tag-like strings: <|x|>, <｜x｜>, <x>, </x>, <ns:x>
_TAG = re.compile(r"</?[|｜]?[A-Za-z_][\w:▁|｜]{0,40}[|｜]?>")
_SKIP = re.compile(r"media|vision|image|video|audio|pad|fim|mask|unk|sep$|tools$|parameter|arg_|invoke"
                   r"|^function$|constrain|placeholder")
_THINK = re.compile(r"think|reason")
_OUTPUT = re.compile(r"response|result|output|observation")
_CALL = re.compile(r"tool_?calls?|function_calls?|^call$")
_TURN = re.compile(r"im_|start|end|begin|user|assistant|system|developer|channel|message|return|turn"
                   r"|sop|eot|sentence")
_CLOSE = re.compile(r"^/|end|return|^call$|eot")
_TOOL_ROLE = re.compile(r"^\s*(tool|ipython|functions?\.|observation)")
# markers that are not tag-like, taken where the template's source writes them: MiniMax-M2's
# role brackets (`]~b]ROLE` opens a turn, its role header says which block; `[e~[` ends one)
_BRACKETS = {"]~b]": Marker("]~b]", "turn", False), "[e~[": Marker("[e~[", "turn", True)}


def classify(marker: str) -> Marker | None:
    """The marker's kind and side, or None when it is not a block boundary."""
    if marker in _BRACKETS:
        return _BRACKETS[marker]
    name = re.sub(r"[<>|｜]", "", marker).replace("▁", "_").lower()
    slash = name.startswith("/")
    name = name.lstrip("/")
    if not name or _SKIP.search(name):
        return None
    # Gemma-style pairs <|turn> ... <turn|>: the bar on the right closes
    right_bar = bool(re.fullmatch(r"<[^|｜].*[|｜]>", marker))
    for kind, rx in (("think", _THINK), ("tool_output", _OUTPUT), ("tool_call", _CALL), ("turn", _TURN)):
        if rx.search(name):
            return Marker(marker, kind, slash or right_bar or bool(_CLOSE.search(name)))
    return None


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "probe",
                                                "parameters": {"type": "object", "properties": {
                                                    "q": {"type": "string"}}, "required": ["q"]}}}


def _probe_conversations():
    call = {"id": "call_probe", "type": "function", "function": {"name": "probe_tool", "arguments": {"q": "x"}}}
    return [
        ([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "ok", "reasoning_content": "hmm", "thinking": "hmm", "tool_calls": [call]},
          {"role": "tool", "content": "out", "tool_call_id": "call_probe", "name": "probe_tool"},
          {"role": "assistant", "content": "done", "reasoning_content": "hmm", "thinking": "hmm"},
          {"role": "user", "content": "again"}], [_PROBE_TOOL]),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
          {"role": "user", "content": "again"}], None),
    ]


def template_markers(tokenizer) -> set[str]:
    """Tag-like strings of the chat template: literal in its source or in its renders."""
    found = set()
    template = getattr(tokenizer, "chat_template", None) or ""
    found.update(_TAG.findall(template))
    found.update(b for b in _BRACKETS if b in template)
    for messages, tools in _probe_conversations():
        try:
            found.update(_TAG.findall(tokenizer.apply_chat_template(messages, tools=tools)))
        except Exception:  # noqa: BLE001 - a template may reject a probe; the others still count
            pass
    return found


class AnchorFinder:
    def __init__(self, markers: list[Marker], token_bytes):
        self.markers = sorted(set(markers))
        self._token_bytes = token_bytes          # id -> bytes
        self._cache: dict[int, bytes] = {}
        self._needles = [(m.text.encode("utf-8"), m) for m in self.markers]
        self._longest = max((len(b) for b, _ in self._needles), default=0)

    @classmethod
    def from_tokenizer(cls, tok) -> "AnchorFinder":
        hf = tok.hf
        added = {t.content: t for t in hf.get_added_tokens_decoder().values()}
        texts = template_markers(tok) | {t for t in added if _TAG.fullmatch(t)}
        in_template = template_markers(tok)
        markers = []
        for text in texts:
            m = classify(text)
            # turn markers only when the template writes them; think/tool markers also
            # when only the vocabulary has them (the model may generate them)
            if m is not None and (text in in_template or m.kind != "turn"):
                markers.append(m)
        return cls(markers, _bytes_of(tok, set(added)))

    def bytes_of(self, token_id: int) -> bytes:
        b = self._cache.get(token_id)
        if b is None:
            b = self._cache[token_id] = self._token_bytes(token_id)
        return b

    def find(self, token_ids, start: int = 0) -> list[Anchor]:
        """Anchors at positions >= start (and 0 < pos <= len(token_ids)), sorted by position;
        where two markers give one position the more specific kind wins."""
        ids = list(token_ids)
        if not self._needles or not ids:
            return []
        lo = max(0, start - self._longest - 1)       # a marker may begin before `start`
        offsets, chunks, off = [], [], 0
        for t in ids[lo:]:
            offsets.append(off)
            b = self.bytes_of(t)
            chunks.append(b)
            off += len(b)
        text = b"".join(chunks)
        found: dict[int, Anchor] = {}
        for needle, m in self._needles:
            i = text.find(needle)
            while i >= 0:
                if m.closing:
                    pos = lo + bisect.bisect_right(offsets, i + len(needle) - 1)
                else:
                    pos = lo + bisect.bisect_right(offsets, i) - 1
                kind = m.kind if m.closing or m.kind != "turn" else self._header_kind(text, i + len(needle))
                if start <= pos <= len(ids) and pos > 0:
                    old = found.get(pos)
                    if old is None or (old.kind == "turn" and kind != "turn"):
                        found[pos] = Anchor(pos, kind, m.text)
                i = text.find(needle, i + 1)
        return [found[p] for p in sorted(found)]

    def _header_kind(self, text: bytes, at: int) -> str:
        """An opening turn marker's role header says what block follows (harmony:
        `<|start|>assistant<|channel|>analysis`, `<|start|>functions.x`)."""
        head = re.split(rb"[\n<]", text[at:at + 64], maxsplit=1)[0].decode("utf-8", "replace")
        if _TOOL_ROLE.match(head):
            return "tool_output"
        if "analysis" in head or "think" in head:
            return "think"
        if " to=" in head or "to=functions" in head:
            return "tool_call"
        return "turn"

    def positions(self, token_ids, start: int = 0) -> list[int]:
        return [a.pos for a in self.find(token_ids, start)]

    def kinds(self, token_ids, start: int = 0) -> dict[int, str]:
        return {a.pos: a.kind for a in self.find(token_ids, start)}


def _bytes_of(tok, added: set[str]):
    """id -> the bytes the token spells (byte-level BPE exactly; others via decode)."""
    hf = tok.hf
    byte_level = "ByteLevel" in repr(hf.decoder)
    table = _byte_decoder()

    def get(token_id: int) -> bytes:
        piece = hf.id_to_token(token_id)
        if piece is None:
            return b""
        if piece in added:
            return piece.encode("utf-8")
        if byte_level and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return hf.decode([token_id]).encode("utf-8")
    return get
