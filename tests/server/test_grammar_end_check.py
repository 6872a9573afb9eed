"""Constrained output that ends on a stop token (EOS) before the grammar accepted a whole value
is "constraint_failed", never "stop" (issue 36, item 3). The engine samples the last token
after the grammar's last look, so the end is checked once more when the answer finishes:
here a sampler that ignores the mask ends the output early on purpose."""
from __future__ import annotations

import json

import httpx
import torch
import pytest

from freetoken.engine import sampler
from freetoken.server.grammar import GrammarProcessor, build_tokenizer, json_schema_grammar

pytest.importorskip("llguidance", reason="constrained decoding needs llguidance")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


def _processor(tok):
    return GrammarProcessor(build_tokenizer(tok), json_schema_grammar(SCHEMA), eos_ids=tok.eos_token_ids)


@pytest.mark.parametrize("text,whole", [('{"ok":true}', True), ('{"ok":false}', True),
                                        ('{"ok":', False), ('{"ok":tr', False), ("", False)])
def test_the_end_check_reads_the_tokens_after_the_last_mask(tiny, text, whole):
    tok = tiny[0].engine.tokenizer
    eos = min(tok.eos_token_ids)
    proc = _processor(tok)
    ids = tok.encode(text) if text else []
    proc(ids[:1], torch.zeros(tok.vocab_size))      # the engine's last call saw one token
    proc.ended_on_stop_token(ids + [eos])
    assert (proc.failed is None) == whole, proc.failed


@pytest.fixture
def early_eos(tiny, monkeypatch):
    """A sampler that ends every constrained output on EOS after three tokens, mask or not."""
    eos = min(tiny[0].engine.tokenizer.eos_token_ids)
    real = sampler.sample_one

    def sample_one(logits, seq):
        tok = real(logits, seq)
        return eos if seq.params.logits_processors and len(seq.output_ids) >= 3 else tok
    monkeypatch.setattr(sampler, "sample_one", sample_one)
    svc = tiny[2]
    svc.max_tokens_cap = None
    yield tiny
    svc.max_tokens_cap = 8


def test_an_early_eos_is_constraint_failed_not_stop(early_eos):
    body = {"model": "capture-model", "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": "json please"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    r = httpx.post(early_eos[1] + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    with pytest.raises(ValueError):
        json.loads(ch["message"]["content"] or "")
    assert ch["finish_reason"] == "constraint_failed", ch
