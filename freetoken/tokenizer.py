"""Tokenizer and chat template from a checkpoint's own files.

Encoding uses the `tokenizers` library on tokenizer.json; the chat template (from
chat_template.jinja or tokenizer_config.json) is rendered in a sandboxed jinja2
environment with the same helpers transformers provides, so tools and kwargs like
`enable_thinking` pass straight through to the template."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from .errors import CheckpointError


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Tokenizer:
    def __init__(self, model: str | Path):
        """`model`: a checkpoint directory or an FTW file (which carries the same files)."""
        from .weights.source import load_json_side_file, read_model_text
        d = Path(model)
        where = d if d.is_dir() else Path(f"{d}:")
        text = read_model_text(d, "tokenizer.json")
        if text is None:
            raise CheckpointError(f"{where / 'tokenizer.json'}: missing tokenizer.json")
        try:
            self.hf = HFTokenizer.from_str(text)
        except Exception as e:
            raise CheckpointError(f"{where / 'tokenizer.json'}: not a readable tokenizer ({e})") from None
        self.config = load_json_side_file(d, "tokenizer_config.json") or {}
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
        self._template = None
        self._template_source = where / ("chat_template.jinja" if template is not None else "tokenizer_config.json")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise CheckpointError(f"{self._template_source}: chat_template must be a string")
        if self.chat_template:
            self._compile_template()       # a broken template is a load error, not a 400 per request

    def _compile_template(self):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.filters["from_json"] = json.loads         # DeepSeek-V3.2/V4 templates parse string arguments
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.chat_template)
        except jinja2.TemplateSyntaxError as e:
            raise CheckpointError(f"{self._template_source}: the chat template does not compile "
                                  f"(line {e.lineno}: {e.message})") from None

    def _token_str(self, key: str) -> str | None:
        t = self.config.get(key)
        return t.get("content") if isinstance(t, dict) else t

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
        if self._template is None:
            self._compile_template()
        return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)
