"""SentencePiece-style GGUF vocabularies as `tokenizers` BPE models.

`tokenizer.ggml.model = llama` (SPM: Llama 1/2, Mistral, Mixtral, Gemma 1-3, ...): llama.cpp
merges, over the whole text with no pre-splitting, the adjacent pair whose concatenation is
the token of highest score (leftmost on ties), and writes what no token covers as <0xXX>
byte tokens. That is byte-fallback BPE whose merges are every split (a, b) of a token,
ranked by the token's score. Spaces are written "▁"; with `add_space_prefix` (the SPM
default) one "▁" leads the text and each piece after a special token, and decoding drops
the first leading space.

`tokenizer.ggml.model = gemma4`: the same "▁" byte-fallback BPE with the file's own merges,
run separately on runs of newlines and runs of other characters; a newline run that is
itself a token is kept whole."""
from __future__ import annotations

from ...errors import CheckpointError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"
_NO_MERGE_TO = (UNKNOWN, CONTROL, BYTE)       # matched whole (specials) or reached only by fallback


def score_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's SPM session: every split of every mergeable token,
    best score first; ties by token id, then by split position (they never compete: two
    splits of one token cannot be adjacent pairs at once)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, (t, s, ty) in enumerate(zip(tokens, scores, types)):
        if ty in _NO_MERGE_TO or len(t) < 2 or vocab[t] != i:
            continue
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                ranked.append((-s, i, k))
    ranked.sort()
    return [(tokens[i][:k], tokens[i][k:]) for _, i, k in ranked]


def file_merges(merges: list[str], path) -> list[tuple[str, str]]:
    """`tokenizer.ggml.merges` entries "A B", split at the first space after the first
    character as llama.cpp does (a token may itself start with a space)."""
    out = []
    for m in merges:
        k = m.find(" ", 1)
        if k < 0:
            raise CheckpointError(f"{path}: tokenizer.ggml.merges entry {m!r} has no space (expected 'A B')")
        out.append((m[:k], m[k + 1:]))
    return out


def spm_tokenizer(meta: dict, tokens: list[str], types: list[int], path, kind: str):
    """The `tokenizers` model, normalizer, pre-tokenizer and decoder for an SPM ('llama') or
    Gemma-4 ('gemma4') vocabulary; special tokens are added by the caller."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    if kind == "llama":
        scores = meta.get("ggml.scores")
        if not scores or len(scores) != len(tokens):
            raise CheckpointError(f"{path}: tokenizer.ggml.scores has {len(scores or [])} entries, expected "
                                  f"{len(tokens)} (SentencePiece merges follow the token scores)")
        merges = score_merges(tokens, [float(s) for s in scores], types)
        prefix = bool(meta.get("ggml.add_space_prefix", True))
    else:
        merges = file_merges(meta.get("ggml.merges") or [], path)
        prefix = bool(meta.get("ggml.add_space_prefix", False))
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = meta.get("ggml.unknown_token_id")
    unk_token = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk_token, fuse_unk=True,
                               byte_fallback=BYTE in types,
                               # Gemma 4: a piece that is a token stays whole (llama.cpp does so for
                               # newline runs, which its merges cannot build; other pieces merge to it)
                               ignore_merges=kind == "gemma4"))
    steps = [normalizers.Prepend(SPACE)] if prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
    if kind == "gemma4":      # llama.cpp's "[^\n]+|[\n]+" split
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("[^\n]+|\n+"), behavior="isolated", invert=False)
    dec = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok
