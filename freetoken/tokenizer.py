"""Tokenizer and chat template from a checkpoint's own files.

Encoding uses the `tokenizers` library on tokenizer.json; the chat template (from
chat_template.jinja or tokenizer_config.json) is rendered in a sandboxed jinja2
environment with the same helpers transformers provides, so tools and kwargs like
`enable_thinking` pass straight through to the template. A template is checkpoint data,
not trusted code: each render is bounded in time (checked at every call and output piece)
and in output size, and a template that recurses, reaches for `__class__` or exceeds the
bounds on a one-message conversation is refused at load."""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from .errors import CheckpointError
from .weights.source import load_json_side_file, read_model_text, read_model_tokenizer


RENDER_SECONDS = 10.0            # one render, however the template loops
PROBE_SECONDS = 1.0              # the load-time render of one short message
RENDER_CHARS = 16 << 20          # a prompt beyond that would not fit any context window


class TemplateLimit(jinja2.exceptions.TemplateError):
    """A render passed its time or output bound."""


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with the render's deadline (per thread: the server renders in
    several) checked at every call, and `*`/`**` refused when the result would be huge."""
    intercepted_binops = frozenset(["*", "**"])

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._local = threading.local()

    @property
    def deadline(self) -> float:
        return getattr(self._local, "deadline", float("inf"))

    @deadline.setter
    def deadline(self, t: float) -> None:
        self._local.deadline = t

    def call(self, __context, __obj, *args, **kwargs):
        if time.monotonic() > self.deadline:
            raise TemplateLimit("rendering took too long")
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            seq, k = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(k, int) and len(seq) * k > RENDER_CHARS:
                raise TemplateLimit(f"a repetition of {len(seq)} x {k} items")
        return super().call_binop(context, operator, left, right)


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _why(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "it recurses too deeply"
    if isinstance(e, MemoryError):
        return "out of memory"
    return str(e)[:200] or type(e).__name__


class Tokenizer:
    def __init__(self, model: str | Path):
        """`model`: a checkpoint directory or an FTW file (which carries the same files)."""
        d = Path(model)
        where = d if d.is_dir() else Path(f"{d}:")
        self.hf = read_model_tokenizer(d)       # a GGUF's, built from its metadata
        if self.hf is None:
            text = read_model_text(d, "tokenizer.json")
            if text is None:
                raise CheckpointError(f"{where / 'tokenizer.json'}: missing tokenizer.json")
            try:
                self.hf = HFTokenizer.from_str(text)
            except Exception as e:
                raise CheckpointError(f"{where / 'tokenizer.json'}: not a readable tokenizer ({e})") from None
        self.config = load_json_side_file(d, "tokenizer_config.json") or {}
        self._config_path = where / "tokenizer_config.json"
        template = read_model_text(d, "chat_template.jinja")
        self.chat_template = template if template is not None else self.config.get("chat_template")
        if isinstance(self.chat_template, list):    # [{"name": "default", "template": ...}, ...]
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default", next(iter(named.values()), None))
        self.bos_token = self._token_str("bos_token")
        self.eos_token = self._token_str("eos_token")
        self.eos_token_ids: set[int] = set()
        gen = load_json_side_file(d, "generation_config.json")
        eos = gen.get("eos_token_id") if gen else None
        for e in (eos if isinstance(eos, list) else [eos]):
            if isinstance(e, int):
                self.eos_token_ids.add(e)
        if self.eos_token and self.hf.token_to_id(self.eos_token) is not None:
            self.eos_token_ids.add(self.hf.token_to_id(self.eos_token))
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
        self._template = self._compiled_from = None
        self._template_source = where / ("chat_template.jinja" if template is not None else "tokenizer_config.json")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise CheckpointError(f"{self._template_source}: chat_template must be a string")
        if self.chat_template:
            self._compile_template()       # a broken template is a load error, not a 400 per request

    def _compile_template(self):
        env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True,
                              extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.filters["from_json"] = json.loads         # DeepSeek-V3.2/V4 templates parse string arguments
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.chat_template)
            self._compiled_from = self.chat_template
        except jinja2.TemplateSyntaxError as e:
            raise CheckpointError(f"{self._template_source}: the chat template does not compile "
                                  f"(line {e.lineno}: {e.message})") from None
        except RecursionError:
            raise CheckpointError(f"{self._template_source}: the chat template is nested too "
                                  "deeply to compile") from None
        try:        # a template that cannot render one user message safely is a load error
            self._bounded_render(messages=[{"role": "user", "content": "hi"}], tools=None,
                                 add_generation_prompt=True, bos_token=self.bos_token or "",
                                 eos_token=self.eos_token or "", seconds=PROBE_SECONDS)
        except (TemplateLimit, RecursionError, jinja2.exceptions.SecurityError, MemoryError) as e:
            raise CheckpointError(f"{self._template_source}: the chat template cannot be rendered "
                                  f"safely ({_why(e)})") from None
        except Exception:  # noqa: BLE001 - raise_exception etc.: that conversation's problem
            pass

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @chat_template.setter
    def chat_template(self, text: str | None) -> None:
        """Replacing the template (tests, --chat-template) drops the compiled one."""
        self._chat_template = text
        self._template = None

    def _token_str(self, key: str) -> str | None:
        """A special token as tokenizer_config.json names it: a string or {"content": string}."""
        t = self.config.get(key)
        t = t.get("content") if isinstance(t, dict) else t
        if t is not None and not isinstance(t, str):
            raise CheckpointError(f"{self._config_path}: field {key!r} is {str(t)[:60]!r} "
                                  f"({type(t).__name__}), expected a token string or {{\"content\": string}}")
        return t

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, **kwargs) -> str:
        if not self.chat_template:
            raise CheckpointError("tokenizer_config.json: no chat_template (and no chat_template.jinja)")
        if self._template is None or self._compiled_from is not self.chat_template:   # (set after load)
            self._compile_template()
        return self._bounded_render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)

    def _bounded_render(self, seconds: float = RENDER_SECONDS, **context) -> str:
        env = self._template.environment
        env.deadline = time.monotonic() + seconds
        out, n = [], 0
        try:
            for piece in self._template.generate(**context):
                n += len(piece)
                if n > RENDER_CHARS:
                    raise TemplateLimit(f"the rendered prompt passed {RENDER_CHARS} characters")
                if time.monotonic() > env.deadline:
                    raise TemplateLimit(f"rendering took more than {seconds:g} s")
                out.append(piece)
        except RecursionError:
            raise TemplateLimit("the chat template recursed too deeply") from None
        return "".join(out)
