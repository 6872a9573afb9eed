"""A `tokenizers` tokenizer from a GGUF file's metadata (tokens, merges, token types,
pre-tokenizer name, special-token ids, chat template).

Byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`): the pre-tokenizer name selects
the split regexes the model's own tokenizer.json uses. SentencePiece (`llama`) and Gemma-4
(`gemma4`) vocabularies: weights/gguf/spm.py. Other vocabulary types are refused by name.
`save_tokenizer_dir` writes tokenizer.json + tokenizer_config.json so that
`freetoken.tokenizer.Tokenizer` reads a GGUF vocabulary like any checkpoint's."""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import CheckpointError
from .meta import read_header
from .spm import spm_tokenizer

# token types written by llama.cpp's converter (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's SMOLLM pre-tokenizer (also codeshell, refact, command-r): digits one by one, then GPT-2's split
_SMOLLM = [r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"]
_DEEPSEEK_LLM = [
    r"[\r\n]",
    # cased letters; escapes keep the code points that Unicode normalization would fold
    # (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126 OHM, U+212A KELVIN)
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝ"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126"
    "\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    r"Ⰰ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
]
_DEEPSEEK3 = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
              r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]

# GLM-4.5 / GLM-5 (llama.cpp's CHATGLM4 split)
_GLM4 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# MiniMax-M2's tokenizer.json split: upper-case runs kept with the lower-case letters after them
_MINIMAX_M2 = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Kimi-K2 (tokenization_kimi.py): Han runs apart, the other letters as MiniMax-M2's without Han
_NOT_HAN = "&&[^\\p{Han}]"
_KIMI_K2 = (r"\p{Han}+"
            rf"|[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]*[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]+"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            rf"|[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]+[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]*"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# GGUF pre-tokenizer name -> the Split regexes (applied in order, matches isolated)
PRE_TOKENIZERS = {
    "qwen2": [_QWEN2], "qwen35": [_QWEN35], "llama3": [_LLAMA3], "llama-bpe": [_LLAMA3],
    "smollm": _SMOLLM,
    "deepseek-llm": _DEEPSEEK_LLM, "deepseek-v3": _DEEPSEEK3,
    "glm4": [_GLM4], "glm5": [_GLM4], "minimax-m2": [_MINIMAX_M2], "kimi-k2": [_KIMI_K2],
}
# llama.cpp takes a whole pre-token that is in the vocabulary as one token, merges or not
IGNORE_MERGES = ("llama3", "llama-bpe", "glm4", "glm5")


def _read(path: Path) -> dict:
    """The `tokenizer.*` metadata of a GGUF file, keys without the `tokenizer.` prefix."""
    fields = read_header(path, tensors=False, keys="tokenizer.").fields
    return {k[len("tokenizer."):]: v for k, v in fields.items() if k.startswith("tokenizer.")}


def _pre_tokenizer(name: str, path: Path):
    from tokenizers import Regex, pre_tokenizers
    if name not in PRE_TOKENIZERS:
        raise CheckpointError(f"{path}: tokenizer.ggml.pre = {name!r} is not supported "
                              f"(expected one of {', '.join(sorted(PRE_TOKENIZERS))})")
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in PRE_TOKENIZERS[name]]
    return pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# tokenizer.ggml.model values llama.cpp knows that have no conversion here, and what they are
UNSUPPORTED = {"bert": "WordPiece", "t5": "Unigram (T5-style SentencePiece)", "rwkv": "RWKV world",
               "plamo2": "PLaMo-2", "no_vocab": "no vocabulary", "none": "no vocabulary"}
SUPPORTED = ("gpt2", "llama", "gemma4")


def load_gguf_tokenizer(path: str | Path):
    """(tokenizers.Tokenizer, tokenizer_config dict) from a GGUF file's tokenizer metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    path = Path(path)
    meta = _read(path)
    model = meta.get("ggml.model")
    if model not in SUPPORTED:
        what = f" ({UNSUPPORTED[model]})" if model in UNSUPPORTED else ""
        raise CheckpointError(f"{path}: tokenizer.ggml.model = {model!r}{what} cannot be converted (expected one of "
                              "'gpt2' byte-level BPE, 'llama' SentencePiece, 'gemma4')")
    tokens = meta.get("ggml.tokens")
    types = meta.get("ggml.token_type") or [NORMAL] * len(tokens or [])
    if not tokens:
        raise CheckpointError(f"{path}: tokenizer.ggml.tokens missing")
    if len(types) != len(tokens):
        raise CheckpointError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries, "
                              f"expected {len(tokens)} (one per token)")
    if model == "gpt2":
        merges = meta.get("ggml.merges")
        if merges is None:
            raise CheckpointError(f"{path}: tokenizer.ggml.merges missing")
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        pre = meta.get("ggml.pre", "default")
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in IGNORE_MERGES))
        tok.pre_tokenizer = _pre_tokenizer(pre, path)
        tok.decoder = decoders.ByteLevel()
    else:
        if model == "gemma4" and not meta.get("ggml.merges"):
            raise CheckpointError(f"{path}: tokenizer.ggml.merges missing (needed by a gemma4 vocabulary)")
        tok = spm_tokenizer(meta, tokens, types, path, model)
    # control tokens are special (skipped when decoding with skip_special_tokens);
    # user-defined ones (<think>, <tool_call>, ...) are plain added tokens, as in tokenizer.json
    added = [AddedToken(t, special=(ty == CONTROL), normalized=False)
             for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)]
    tok.add_tokens(added)
    # llama.cpp's defaults when the key is absent: BOS for SentencePiece, always for Gemma 4
    add_bos = bool(meta.get("ggml.add_bos_token", model == "llama")) or model == "gemma4"
    bos = meta.get("ggml.bos_token_id", 1 if model == "llama" else None)
    if add_bos and isinstance(bos, int) and 0 <= bos < len(tokens):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B", special_tokens=[(tokens[bos], bos)])

    def name(key):
        i = meta.get(f"ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name("bos"),
              "eos_token": name("eos"), "pad_token": name("padding"),
              "add_bos_token": add_bos}
    if meta.get("chat_template"):
        config["chat_template"] = meta["chat_template"]
    return tok, config


def save_tokenizer_dir(gguf_path: str | Path, out_dir: str | Path, chat_template: str | None = None) -> Path:
    """Write tokenizer.json and tokenizer_config.json (chat template from the GGUF unless given)."""
    tok, config = load_gguf_tokenizer(gguf_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    if chat_template is not None:
        config["chat_template"] = chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False))
    return out
