"""`freetoken perplexity`: llama-perplexity's method (whole n_ctx chunks, BOS first where the
vocabulary adds one, the second half scored) over FreeToken's logits equals the same method
computed here from transformers' logits on the same checkpoint; and the command prints it."""
from __future__ import annotations

import math

import torch

from freetoken import LLM
from freetoken.cli import main
from freetoken.quality.perplexity import chunks, perplexity

from helpers import reference_logits
from model_checks import ids_for

TEXT = ("the quick brown fox jumps over the lazy dog while a model routes every token to a few experts "
        "def main return import json print value list dict function name arguments result error file path\n") * 12


def test_chunks_are_whole_windows_with_bos_first():
    toks = list(range(10, 45))
    got = list(chunks(toks, 8, bos_id=1))
    assert len(got) == 4 and all(len(c) == 8 for c in got)            # the 3-token tail dropped
    assert got[1] == [1] + toks[9:16]
    assert list(chunks(toks, 8, None))[2] == toks[16:24]
    assert len(list(chunks(toks, 8, None, max_chunks=2))) == 2


def test_perplexity_matches_the_method_on_transformers_logits(tiny_dir):
    d = tiny_dir("llama")
    toks, ctx = ids_for(96, seed=2), 32
    ours = perplexity(LLM(str(d), dtype="float32").score, toks, ctx, bos_id=None)
    nll, n = 0.0, 0
    for i in range(3):
        c = toks[i * ctx:(i + 1) * ctx]
        lp = torch.log_softmax(reference_logits(d, c).double(), -1)
        for j in range(ctx // 2, ctx - 1):        # logits at j predict token j + 1
            nll -= lp[j, c[j + 1]].item()
            n += 1
    assert ours.count == n == 3 * 15
    assert math.isclose(ours.ppl, math.exp(nll / n), rel_tol=1e-5)


def test_perplexity_command(tiny_dir, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text(TEXT)
    assert main(["perplexity", "--model", str(tiny_dir("llama")), "--text", str(f), "--ctx", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Final estimate: PPL = ") and "tokens scored" in out
    assert main(["perplexity", "--model", str(tiny_dir("llama")), "--text", str(f), "--ctx", "4096"]) == 2
    assert "need at least 8192" in capsys.readouterr().err
