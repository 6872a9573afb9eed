"""`freetoken pull NAME` and `freetoken run NAME [PROMPT]`; `register(subparsers)` is called by
freetoken.cli. NAME: `Org/Name`, `Org/Name:QUANT`, `hf.co/Org/Name[:QUANT]` (Hugging Face) or
`name[:tag]`, `library/name[:tag]` (Ollama library); `--source` settles a `namespace/name` that
is an Ollama user's model."""
from __future__ import annotations

import re
import shlex
import sys

from ..errors import CheckpointError, PullError


def source_of(spec: str, source: str = "auto") -> str:
    if source != "auto":
        return source
    s = re.sub(r"^https?://", "", spec)
    if s.startswith(("hf.co/", "huggingface.co/")):
        return "hf"
    return "ollama" if s.startswith("library/") or "/" not in s.partition(":")[0] else "hf"


def model_name(spec: str, source: str = "auto") -> str:
    """The `--model` name that resolves to what `pull(spec)` stores."""
    if source_of(spec, source) == "hf":
        from .hf import parse_name
        repo, quant = parse_name(spec)
        return f"{repo}:{quant}" if quant else repo
    return spec


def pull(spec: str, *, source: str = "auto", include: list[str] | None = None, revision: str = "main",
         registry: str | None = None, retries: int = 3) -> str:
    """Downloads `spec` into its store; returns the local path `--model` will load."""
    from ..weights.stores import resolve_model
    if source_of(spec, source) == "hf":
        from . import hf
        snapshot = hf.pull(spec, include=include, revision=revision, retries=retries)
        try:
            return resolve_model(model_name(spec, "hf")) if revision == "main" else str(snapshot)
        except CheckpointError:              # --include took several GGUFs: the snapshot it is
            return str(snapshot)
    if include:
        raise PullError("--include selects files of a Hugging Face repo; an Ollama model is pulled whole")
    from . import ollama
    ollama.pull(spec, registry=registry, retries=retries)
    return resolve_model(spec)


def _source_args(p) -> None:
    p.add_argument("--source", default="auto", choices=["auto", "hf", "ollama"],
                   help="where NAME lives (auto: ORG/NAME is Hugging Face, NAME[:TAG] and library/NAME are Ollama)")
    p.add_argument("--include", action="append", default=[], metavar="PATTERN",
                   help="Hugging Face: download only the files matching this glob (repeatable), "
                        "e.g. '*Q4_K_M*.gguf'")
    p.add_argument("--revision", default="main", help="Hugging Face: branch, tag or commit (default main)")
    p.add_argument("--registry", default=None, metavar="URL",
                   help="Ollama registry base URL (default $FREETOKEN_OLLAMA_REGISTRY, else https://registry.ollama.ai)")
    p.add_argument("--retries", type=int, default=3, help="resume a cut download this many times (default 3)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "pull", help="download a model from Hugging Face or the Ollama library",
        description="Download a model into the standard local store (Hugging Face: the hub cache; "
                    "Ollama: ~/.ollama/models), resumably and verified, so --model NAME finds it. "
                    "Examples: freetoken pull Qwen/Qwen3-30B-A3B-GGUF:Q4_K_M ; freetoken pull qwen3:30b-a3b")
    p.add_argument("name", help="Org/Name[:QUANT] (Hugging Face) or name[:tag] (Ollama library)")
    _source_args(p)
    p.set_defaults(func=cmd_pull)

    r = subparsers.add_parser(
        "run", help="pull a model if missing, serve it and chat with it in the terminal",
        description="Like `ollama run`: pull NAME if it is not on this machine, start `freetoken serve` "
                    "on a loopback port, then chat (/bye leaves). With PROMPT: answer it once and exit.")
    r.add_argument("name", help="Org/Name[:QUANT] (Hugging Face) or name[:tag] (Ollama library)")
    r.add_argument("prompt", nargs="?", default=None, help="answer this one prompt and exit")
    r.add_argument("--system", default=None, help="a system message for the conversation")
    r.add_argument("--max-tokens", type=int, default=None, help="per answer (default: the server's)")
    r.add_argument("--temperature", type=float, default=None)
    r.add_argument("--port", type=int, default=0, help="the server's port (default: any free one)")
    r.add_argument("--serve-args", default="", metavar="'ARGS'",
                   help="more `freetoken serve` options, one string, e.g. '--expert-cache-gib 4 --threads 8'")
    _source_args(r)
    r.set_defaults(func=cmd_run)


def cmd_pull(args) -> int:
    path = pull(args.name, source=args.source, include=args.include, revision=args.revision,
                registry=args.registry, retries=args.retries)
    name = model_name(args.name, args.source)
    print(f"{name}: {path}")
    print(f"serve it with: freetoken serve --model {shlex.quote(name)}", file=sys.stderr)
    return 0


def cmd_run(args) -> int:
    from ..weights.stores import resolve_model
    from .chat import ServerProcess, repl, stream_reply
    name = model_name(args.name, args.source)
    try:
        resolve_model(name)
    except CheckpointError:
        print(f"{name} is not on this machine; pulling it", file=sys.stderr)
        pull(args.name, source=args.source, include=args.include, revision=args.revision,
             registry=args.registry, retries=args.retries)
    options = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature))
               if v is not None}
    prompt = args.prompt
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()            # `echo question | freetoken run NAME`
    with ServerProcess(name, shlex.split(args.serve_args), args.port) as server:
        url = server.wait_ready()
        if prompt is not None:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            stream_reply(url, name, [*messages, {"role": "user", "content": prompt}], options)
            return 0
        return repl(url, name, options, args.system)
