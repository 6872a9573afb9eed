"""Runs llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-python sdist) with its
vendored gguf-py. Home-made test tokenizers are not in its table of known pre-tokenizers:
they fall back to "qwen2" (the split our tiny tokenizers use); GLM's vocab step falls back to
the plain BPE one when the tokenizer lacks GLM's special tokens.
Usage: python llamacpp_convert.py LLAMA_CPP_DIR MODEL_DIR [converter options]"""
import sys

src = sys.argv.pop(1)
sys.path[:0] = [src + "/gguf-py", src]
import convert_hf_to_gguf as converter  # noqa: E402

try:
    from conversion.base import TextModel      # llama.cpp after the converter was split up
except ImportError:
    TextModel = converter.TextModel
known_pre = TextModel.get_vocab_base_pre


def vocab_base_pre(self, tokenizer):
    try:
        return known_pre(self, tokenizer)
    except NotImplementedError:
        return "qwen2"


TextModel.get_vocab_base_pre = vocab_base_pre
known_glm = TextModel._set_vocab_glm


def set_vocab_glm(self):
    """GLM's vocab needs its special tokens ([gMASK] as BOS, <|user|>, <|observation|>); the
    tiny test tokenizers have chat-ML specials instead, written as any BPE vocab."""
    from transformers import AutoTokenizer
    if "[gMASK]" in AutoTokenizer.from_pretrained(self.dir_model).get_added_vocab():
        return known_glm(self)
    return self._set_vocab_gpt2()


TextModel._set_vocab_glm = set_vocab_glm
try:   # DeepSeek-V3.2's vocab step asserts add_bos_token, which the tiny test tokenizers do not set
    from conversion.deepseek import DeepseekV32Model
    DeepseekV32Model.set_vocab = lambda self: self._set_vocab_gpt2()
except ImportError:
    pass
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
converter.main()
