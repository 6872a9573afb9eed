"""The `freetoken` command: `generate` and `make-tiny` here, every other verb in its own module
(a module with `register(subparsers)`), imported when the parser is built."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from ..engine.args import add_engine_args, engine_options
from ..errors import FreeTokenError
from ..hub import cli as hub_cli
from ..sim import cli as sim_cli
from . import check, convert, perplexity, plan, profile, serve

# The other verbs, each a module with register(subparsers); `pull`/`run` and `sim` register
# from their subsystems (hub/cli.py, sim/cli.py), which have no layer above them to reach.
VERBS = (serve, profile, sim_cli, convert, plan, check, hub_cli, perplexity)


def generate_model(model: str | None) -> str:
    """--model of `generate`: as given, else the installed default model, else the random demo
    (with a line on stderr saying its output is random)."""
    from ..default_model import choose, not_installed_hint
    path, kind = choose(model)
    if kind != "demo":
        return path
    if model is None:
        print(f"freetoken: {not_installed_hint()}; using the random-weight demo", file=sys.stderr)
    from ..server.build import ensure_demo_model
    print("freetoken: RANDOM-weight demo model (freetoken-demo): its output is gibberish", file=sys.stderr)
    return str(ensure_demo_model())


def terminal_safe(text: str) -> str:
    """Text for a terminal: control characters (a random model emits ESC, BEL, ...) escaped,
    newlines and tabs kept."""
    return "".join(c if c in "\n\t" or c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def cmd_generate(args) -> int:
    from ..llm import LLM
    from ..sampling_params import SamplingParams
    args.model = generate_model(args.model)
    prompt = args.prompt
    if args.chat:   # before the weights are read: a template that cannot render fails in a second
        from ..tokenizer import Tokenizer
        try:
            prompt = Tokenizer(args.model).apply_chat_template([{"role": "user", "content": prompt}])
        except FreeTokenError:
            raise
        except Exception as e:  # noqa: BLE001 - a template raises anything (the server answers 400)
            raise FreeTokenError(f"the chat template could not render this prompt: {type(e).__name__}: {e}") from None
    llm = LLM(args.model, **engine_options(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                            top_p=args.top_p, top_k=args.top_k)
    engine = llm.engine
    engine.add_request("cli", llm.tokenizer.encode(prompt), params)
    ids, text = [], []
    while engine.has_unfinished():
        for out in engine.step():
            if getattr(out, "error", None):
                print(f"error: generation failed in the engine: {out.error}", file=sys.stderr)
                llm.close()
                return 1
            ids.extend(out.new_token_ids)
            text.append(out.new_text)
            if not args.json:
                sys.stdout.write(terminal_safe(out.new_text) if sys.stdout.isatty() else out.new_text)
                sys.stdout.flush()
    if args.json:
        print(json.dumps({"token_ids": ids, "text": "".join(text)}))
    else:
        print()
    llm.close()
    return 0


def cmd_make_tiny(args) -> int:
    from ..tiny import make_tiny
    out = make_tiny(args.arch, args.out_dir, layers=args.layers, experts=args.experts, top_k=args.top_k,
                    hidden=args.hidden, vocab=args.vocab, seed=args.seed, dtype=args.dtype, nextn=int(args.nextn))
    print(f"wrote random-weight {args.arch} checkpoint to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="freetoken", description="Serve large MoE models on small machines.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt (streams to stdout)")
    g.add_argument("--model", default=None, help="HF checkpoint directory, GGUF or FTW file (default: "
                   "SmolLM2-135M-Instruct if installed, else the random-weight demo `freetoken-demo`)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object with token_ids and text")
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)

    from ..tiny import ARCHS
    t = sub.add_parser("make-tiny", help="write a small random-weight checkpoint (demo model, test fixture)")
    t.add_argument("arch", choices=sorted(ARCHS))
    t.add_argument("out_dir")
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--experts", type=int, default=8)
    t.add_argument("--top-k", type=int, default=2)
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--vocab", type=int, default=512)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    t.add_argument("--nextn", action="store_true",
                   help="with a multi-token-prediction layer (deepseek_v3, glm4_moe: --speculative mtp)")
    t.set_defaults(func=cmd_make_tiny)

    for module in VERBS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # a verb that re-runs itself (serve --replicas)
    if getattr(args, "json", False):
        from ..progress import set_mode
        set_mode("off")             # stdout is one JSON object; stderr stays quiet too
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args) or 0
    except FreeTokenError as e:
        print(f"freetoken: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        # a verb's own one-line refusal (`raise SystemExit("freetoken serve: ...")`): one prefix
        # and one exit code for every CLI error, as for FreeTokenError
        if not isinstance(e.code, str):
            raise
        msg = e.code
        for prefix in (f"freetoken {args.command}: ", "freetoken: "):
            if msg.startswith(prefix):
                msg = msg[len(prefix):]
                break
        print(f"freetoken: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
