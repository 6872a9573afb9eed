"""`freetoken perplexity --model M --text FILE`: llama-perplexity's measurement
(quality/perplexity.py) with FreeToken's engine."""
from __future__ import annotations

import sys
from pathlib import Path

from ..engine.args import add_engine_args, engine_options
from ..errors import FreeTokenError


def register(sub) -> None:
    p = sub.add_parser("perplexity", help="perplexity of a text file, measured as llama.cpp's llama-perplexity does")
    p.add_argument("--model", required=True, help="checkpoint directory, GGUF or FTW file")
    p.add_argument("--text", required=True, help="a UTF-8 text file")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk, llama-perplexity's -c (default 512)")
    p.add_argument("--chunks", type=int, default=None, help="evaluate at most this many chunks (default: all)")
    add_engine_args(p)
    p.set_defaults(func=cmd_perplexity, dtype="float32")


def cmd_perplexity(args) -> int:
    from ..llm import LLM
    from ..quality.perplexity import perplexity, text_tokens
    path = Path(args.text).expanduser().resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FreeTokenError(f"{path}: cannot read the text ({e})") from None
    opts = engine_options(args)
    opts.setdefault("max_model_len", max(args.ctx, 16))
    llm = LLM(args.model, **opts)
    try:
        tokens, bos = text_tokens(llm.tokenizer, text)
        if len(tokens) < 2 * args.ctx:
            raise FreeTokenError(f"{path}: {len(tokens)} tokens, need at least {2 * args.ctx} "
                                 f"(two chunks of --ctx {args.ctx})")
        print(f"{len(tokens)} tokens, {len(tokens) // args.ctx} chunks of {args.ctx}", file=sys.stderr)

        def show(i, ppl):
            print(f"[{i + 1}]{ppl.ppl:.4f}", end=" " if (i + 1) % 10 else "\n", file=sys.stderr, flush=True)

        res = perplexity(llm.score, tokens, args.ctx, bos, args.chunks, on_chunk=show)
        print(file=sys.stderr)
        print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.err:.5f} ({res.count} tokens scored)")
    finally:
        llm.close()
    return 0
