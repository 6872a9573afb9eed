"""Lark pieces for forced tool calls (llguidance syntax), shared by the parser families: each
family's `forced_call_lark` writes its own markup around them, exactly as its parser reads a call
back. `lit(tag)` (from grammar.py) is a tag's terminal: its special token where the vocabulary has
one, else its text."""
from __future__ import annotations

import json
import re
from typing import Callable

from .base import is_bare_string

Lit = Callable[[str], str]


def text(s: str) -> str:
    """A lark string literal of plain text."""
    return json.dumps(s, ensure_ascii=False)


def json_value(schema: dict | None) -> str:
    """A %json value of `schema`, spaced as json.dumps and the templates' tojson write it (no free
    whitespace: with it a weak model can pad forever)."""
    schema = dict(schema if isinstance(schema, dict) else {}, **{"x-guidance": {
        "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}})
    return f"%json {json.dumps(schema, ensure_ascii=False)}"


def _rx(s: str) -> str:
    return re.escape(s).replace("/", "\\/").replace("\n", "n")


def raw_text(forbidden: list[str], schema=None, close: str = "") -> str:
    """A lark regex of any text (newlines too) that contains none of `forbidden` (the tags that
    would end it for the parser), within the schema's minLength / maxLength, then `close`. A
    closing tag written as text belongs to the same lexeme: llguidance's lexemes are greedy, so a
    value lexeme alone would run on into the tag instead of ending before it."""
    bad = "|".join(_rx(s) for s in forbidden)
    lo = schema.get("minLength", 0) if isinstance(schema, dict) else 0
    hi = schema.get("maxLength") if isinstance(schema, dict) else None
    ok = lambda n: isinstance(n, int) and not isinstance(n, bool) and n >= 0     # noqa: E731
    count = f"{{{lo if ok(lo) else 0},{hi if ok(hi) else ''}}}" if ok(hi) or (ok(lo) and lo) else "*"
    return rf"/(?s:.){count}{_rx(close)}/ & ~/(?s:.*)({bad})(?s:.*){_rx(close)}/"


def after_think(lark: str, lit: Lit) -> str:
    """The grammar `lark` (its first rule `start`) after a think block the generation prompt left
    open: closed at once, then the call, as the templates render a turn (</think>, newlines)."""
    assert lark.startswith("start:"), lark[:40]
    return (f'start: "\\n"? {lit("</think>")} "\\n"? "\\n"? "\\n"? markup\nmarkup:'
            + lark[len("start:"):])


def one_of(calls: list[tuple[str, dict]], call: Callable[[int, str, dict], tuple[str, list[str]]]) -> str:
    """Rules `body: call0 | call1 ...` from `call(i, name, schema)` -> (its expression, its extra rules)."""
    alts, rules = [], []
    for i, (name, schema) in enumerate(calls):
        expr, extra = call(i, name, schema or {"type": "object"})
        alts.append(f"call{i}")
        rules += [f"call{i}: {expr}", *extra]
    return "body: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n"


def params(i: int, schema: dict, head: Callable[[str, bool], str], close: str, lit: Lit,
           forbidden: list[str]) -> tuple[str, list[str]]:
    """The key/value form's arguments: each property of `schema` in its order, the required ones
    always there, the others optional, no others. A parameter is `head(key, bare)`, its value
    (a bare string as text without `forbidden`, else JSON of its schema), then the `close` tag."""
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [k for k in schema.get("required") or [] if isinstance(k, str)]
    keys = list(props) + [k for k in required if k not in props]
    end = lit(close)
    special = end.startswith("<[")          # a special token: never part of a text lexeme
    seq, rules = [], []
    for j, key in enumerate(keys):
        sub = props.get(key)
        bare = is_bare_string(sub)
        value = f"v{i}_{j}"
        if bare and isinstance(sub, dict) and isinstance(sub.get("enum"), list) and \
                all(isinstance(e, str) for e in sub["enum"]) and sub["enum"]:
            rules.append(f"{value}: (" + " | ".join(text(e) for e in sub["enum"]) + f") {end}")
        elif bare and special:
            rules.append(f"{value}: V{i}_{j} {end}\nV{i}_{j}: {raw_text(forbidden, sub)}")
        elif bare:
            rules.append(f"{value}: V{i}_{j}\nV{i}_{j}: {raw_text(forbidden, sub, close)}")
        else:               # a $ref in the value resolves against the tool schema's definitions
            defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema and isinstance(sub, dict)}
            rules.append(f"{value}: {json_value(dict(sub, **defs) if defs else sub)} {end}")
        rules.append(f"p{i}_{j}: {head(key, bare)} {value}")
        seq.append(f"p{i}_{j}" if key in required else f"p{i}_{j}?")
    return " ".join(seq) or '""', rules
