"""Constrained decoding with llguidance: JSON schema / JSON object outputs and forced
tool calls become logits processors that mask every token the grammar cannot take."""
from __future__ import annotations

import json
import logging

import torch

from .errors import BadRequest
from .parsers.forced import after_think
from .schema_check import check_schema

log = logging.getLogger("freetoken.server")

_BITS = torch.arange(32, dtype=torch.int32)
# Compiling a schema holds the GIL (about 0.6 ms per KiB): bound the source a request may send.
MAX_GRAMMAR_SOURCE = 128 << 10


def check_grammar_size(source, where: str) -> None:
    n = len(json.dumps(source))
    if n > MAX_GRAMMAR_SOURCE:
        raise BadRequest(f"{where}: the schema is {n} bytes of JSON; constrained output accepts at "
                         f"most {MAX_GRAMMAR_SOURCE}", param=where)


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError:
        raise BadRequest("constrained output (response_format json, forced tool calls) needs the "
                         "llguidance package on the server: pip install 'llguidance>=1.0'") from None
    return llguidance


def build_tokenizer(tokenizer):
    """llguidance's tokenizer from ours (a `tokenizers.Tokenizer` or a transformers fast one)."""
    llguidance = _llguidance()
    eos = sorted(getattr(tokenizer, "eos_token_ids", ()) or ()) or None
    hf = tokenizer.hf
    if hasattr(hf, "to_str"):
        return llguidance.LLTokenizer(hf.to_str(), n_vocab=tokenizer.vocab_size, eos_token=eos)
    return llguidance.hf.from_tokenizer(hf, eos_token=eos)


def json_schema_grammar(schema: dict | None, where: str = "response_format.json_schema.schema") -> str:
    llguidance = _llguidance()
    check_schema(schema, where)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema if schema is not None else {"type": "object"},
            defaults={"whitespace_flexible": False})
    except (ValueError, TypeError, RuntimeError) as e:
        raise BadRequest(f"invalid response format schema: {e}") from None


def lark_grammar(lark: str) -> str:
    llguidance = _llguidance()
    try:
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError, RuntimeError) as e:
        raise BadRequest(f"invalid tool schema for a forced tool call: {e}") from None


def _literal(tag: str, tokenizer, lltok) -> str:
    """A lark terminal for tag: its special token when the vocabulary has one."""
    tid = tokenizer.token_to_id(tag) if hasattr(tokenizer, "token_to_id") else None
    if tid is not None and lltok.is_special_token(tid):
        return f"<[{tid}]>"
    return json.dumps(tag)


def forced_tool_call_grammar(parser_cls, calls: list[tuple[str, dict]], tokenizer, lltok,
                             in_think: bool = False) -> str:
    """One tool call to one of `calls` (name, parameters schema), in the markup of the parser
    family `parser_cls` as the checkpoint's chat template renders it; `in_think`: the generation
    prompt opened a think block (MiniMax-M2 always does), which the output closes first."""
    for name, schema in calls:
        check_schema(schema, f"tools[{name!r}].function.parameters")
    template = getattr(tokenizer, "chat_template", None) or ""

    def lit(tag):
        return _literal(tag, tokenizer, lltok)
    lark = parser_cls.forced_call_lark(calls, lit, template if isinstance(template, str) else "")
    return lark_grammar(after_think(lark, lit) if in_think else lark)


class GrammarProcessor:
    """Logits processor (engine contract: f(output_token_ids, logits[vocab]) -> logits)."""

    def __init__(self, lltok, grammar: str, eos_ids=(), where: str = "response_format"):
        llguidance = _llguidance()
        self.matcher = llguidance.LLMatcher(lltok, grammar)
        if self.matcher.is_error():
            raise BadRequest(f"invalid {where}: {self.matcher.get_error()}", param=where)
        self.vocab = lltok.vocab_size
        self.seen = 0
        self.where = where
        # why the output could not go on under the grammar (generation.py ends the response
        # with finish_reason "constraint_failed" rather than "stop"), or None
        self.failed: str | None = None
        self.eos = sorted(eos_ids)
        self.mask = torch.full(((self.vocab + 31) // 32,), -1, dtype=torch.int32)
        # the first mask, now: a grammar that accepts nothing (a cycle the schema check did not
        # see) fails here as a 400, not as a 200 with empty content
        self.matcher.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.mask.numel() * 4)
        if self.matcher.is_error():
            why = (self.matcher.get_error() or "").splitlines()[0][:200]
            raise BadRequest(f"invalid {where}: the schema accepts no JSON value ({why})", param=where)

    def _consume(self, output_token_ids: list[int]) -> None:
        new = output_token_ids[self.seen:]
        self.seen = len(output_token_ids)
        for t in new:
            if not self.matcher.consume_token(t):
                # not get_error(): it quotes the output generated so far
                log.warning("grammar rejected token %d; the output ends here", t)
                self.failed = (f"the output could not continue under the {self.where} constraint "
                               f"(no token the grammar allows could follow); it ends unfinished")

    def ended_on_stop_token(self, output_token_ids: list[int]) -> None:
        """The output ended on a stop token (EOS), which is not part of the text: the tokens
        before it must make a whole value, else the answer is marked failed, never a "stop".
        The engine samples the last tokens after the last call, so they are read here."""
        self._consume(output_token_ids[:-1])
        if self.failed is None and not (self.matcher.is_accepting() or self.matcher.is_stopped()):
            log.warning("the output ended on a stop token before the grammar accepted it")
            self.failed = (f"the output ended before it was complete under the {self.where} "
                           "constraint; it ends unfinished")

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self._consume(output_token_ids)
        out = logits.clone()
        if self.matcher.is_error():     # cannot continue: end the output
            self.failed = self.failed or (f"the output could not continue under the {self.where} "
                                          "constraint; it ends unfinished")
            if self.eos:
                keep = out[..., self.eos].clone()
                out.fill_(float("-inf"))
                out[..., self.eos] = keep
            return out
        self.matcher.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.mask.numel() * 4)
        allowed = ((self.mask.unsqueeze(1) >> _BITS) & 1).flatten().bool()
        n = min(logits.shape[-1], allowed.numel())
        out[..., :n] = out[..., :n].masked_fill(~allowed[:n], float("-inf"))
        out[..., n:] = float("-inf")
        return out
