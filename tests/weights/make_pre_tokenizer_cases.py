"""Writes data/pre_tokenizers.json: llama.cpp's own token ids for the qwen2 test vocabulary
(../shared/data/tokenizers) with its tokenizer.ggml.pre set to each name below, over the
vocabulary's test texts plus a few that tell the splits apart (Han runs, CamelCase, digits).
Run once where llama-cpp-python is installed: python tests/weights/make_pre_tokenizer_cases.py"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from gguf_rewrite import rewrite  # noqa: E402
from helpers import SHARED_DATA  # noqa: E402

PRES = ("glm4", "minimax-m2", "kimi-k2", "llama-bpe")
EXTRA = ["HelloWorld CamelCaseWords and XMLHttpRequest", "数字12345和汉字混合mixed中文Text", "日本語のテキストとカタカナ",
         "don't I'LL we'Ve 1234567 3.14159", "path/to/file.py\n\n  indented\tline\r\n", "Ünïcödé ÀÉÎ façade ΑΒΓ αβγ"]


def main():
    import llama_cpp
    src = SHARED_DATA / "tokenizers" / "ggml-vocab-qwen2.gguf"
    texts = src.with_name(src.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n") + EXTRA
    out = {"vocab": src.name, "llama_cpp_python": llama_cpp.__version__, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRES:
            g = rewrite(src, Path(tmp) / f"{pre}.gguf", set_keys={"tokenizer.ggml.pre": pre})
            llm = llama_cpp.Llama(str(g), vocab_only=True, verbose=False)
            out["cases"][pre] = [[t, llm.tokenize(t.encode(), add_bos=False, special=False)] for t in texts]
    (HERE / "data" / "pre_tokenizers.json").write_text(json.dumps(out, ensure_ascii=False, indent=0))


if __name__ == "__main__":
    main()
