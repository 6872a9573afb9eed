"""`freetoken make-tiny`: small random-weight HF checkpoints for every supported
architecture, with a real byte-level BPE tokenizer (trained here) and a chat template.
They are the demo model and the test fixtures. Configs come from transformers' own
config classes and weights are written by transformers' save_pretrained, so the files
have exactly the layout real checkpoints have."""
from __future__ import annotations

import importlib
import json
from importlib import resources
from pathlib import Path

import torch

from .models.deepseek import deepseek_v4
from .models import gpt_oss
from .models.registry import ARCHITECTURES
from .quant.fp8 import quantize_checkpoint_fp8
from .weights import modelopt

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                  "</tool_call>", "<tool_response>", "</tool_response>"]


def _recipes() -> dict[str, type]:
    """make-tiny's name (the model module) -> model class, for every registered class that
    writes its own `tiny_config` (models/decoder.py): a new architecture is listed by its file."""
    out = {}
    for module, name in ARCHITECTURES.values():
        cls = getattr(importlib.import_module(f"freetoken.models.{module}"), name)
        if "tiny_config" in vars(cls):
            out[module.rsplit(".", 1)[-1]] = cls     # the file's name, without its family folder
    return out


ARCHS = _recipes()
ARCHS["gpt_oss_mxfp4"] = ARCHS["gpt_oss"]      # same model, experts written as MXFP4 blocks/scales
ARCHS["glm4_moe_nvfp4"] = ARCHS["glm4_moe"]    # same model, routed experts as ModelOpt NVFP4
ARCHS["deepseek_v3_fp8"] = ARCHS["deepseek_v3"]  # same model, projections and experts as FP8 128x128 blocks
ARCHS["deepseek_v4_fp4"] = ARCHS["deepseek_v4"]  # V4-Flash's format: FP8/UE8M0 projections, FP4 experts


def _corpus() -> list[str]:
    text = resources.files("freetoken.templates").joinpath("qwen.jinja").read_text()
    words = ("the quick brown fox jumps over the lazy dog while a model routes every token to a few "
             "experts and the cache keeps the hot ones close to the compute units hello world def main "
             "return import json print value list dict function name arguments result error file path")
    lines = [words, text, "def add(a, b):\n    return a + b\n", '{"name": "get_weather", "arguments": {"city": "Paris"}}']
    lines += [" ".join(words.split()[i:] + words.split()[:i]) for i in range(0, 60, 3)]
    return lines * 4


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def randomize_constant_inits(model, seed: int = 0) -> None:
    """GLM-5.3-Flash parameters transformers initialises to constants (pool gates and position
    terms, hyper-connection biases and scales, KDA decay rates, norm weights): random values, as
    trained checkpoints have, so a swapped or ignored one shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    names = ("index_kpool_compress", "_hc.base", "_hc.scale", "A_log", "o_norm.weight", "layernorm.weight",
             "k_norm.")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" not in name and any(n in name for n in names):
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.3)


def randomize_selection_biases(model, seed: int = 0) -> None:
    """Sigmoid routers' correction biases and DeepSeek-V4's hash-routing table start at zero in
    transformers; real checkpoints carry learned ones, and zeros would leave them untested."""
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.uniform_(-0.05, 0.05)
        if name.endswith("tid2eid"):                       # a real token -> experts table
            g, experts = torch.Generator().manual_seed(seed), model.config.n_routed_experts
            buf.copy_(torch.stack([torch.randperm(experts, generator=g)[:buf.shape[1]] for _ in range(buf.shape[0])]))


def make_tiny(arch: str, out_dir: str | Path, layers: int = 2, experts: int = 8, top_k: int = 2,
              hidden: int = 64, vocab: int = 512, seed: int = 0, dtype: str = "float32", nextn: int = 0,
              **overrides) -> Path:
    """Write a random-weight checkpoint of `arch` to out_dir and return its path. nextn: with
    one multi-token-prediction layer (DeepSeek-V3/GLM-4.5 layout, `add_nextn_layer`)."""
    import transformers
    if arch not in ARCHS:
        raise ValueError(f"make-tiny: unknown architecture {arch!r} (expected one of {', '.join(sorted(ARCHS))})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    model_cls = ARCHS[arch]
    cls_name, kwargs = model_cls.tiny_config(layers + (1 if nextn else 0), experts, top_k, hidden, vocab)
    text = kwargs.get("text_config", kwargs)
    text.update(bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    text.update(overrides)
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    if model_cls.tiny_model:
        model = getattr(transformers, model_cls.tiny_model)(config)
        randomize_constant_inits(model, seed)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config)
    randomize_selection_biases(model, seed)
    model.to(getattr(torch, dtype)).save_pretrained(out)
    if arch.endswith("_nvfp4"):
        modelopt.quantize_checkpoint(out, lambda name: ".experts." in name)
    if arch.endswith("_mxfp4"):
        gpt_oss.quantize_checkpoint_experts(out)
    if arch == "deepseek_v4_fp4":
        deepseek_v4.quantize_checkpoint(out)
    if arch.endswith("_fp8"):
        quantize_checkpoint_fp8(out)
    if nextn:
        add_nextn_layer(out, layers, seed)
    tok.save(str(out / "tokenizer.json"))
    template = resources.files("freetoken.templates").joinpath("qwen.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "model_max_length": 4096, "chat_template": template}, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"]}, indent=2))
    return out


def add_nextn_layer(out: Path, layers: int, seed: int = 0) -> None:
    """Turn a checkpoint saved with `layers` + 1 decoder layers into one of `layers` layers and a
    nextn layer: the last decoder layer stays as the nextn layer's block, its five extra tensors
    (enorm, hnorm, eh_proj, shared_head norm and head) are written at random, and the config
    says num_nextn_predict_layers = 1. transformers neither writes nor runs these."""
    from safetensors.torch import load_file, save_file
    cfg = json.loads((out / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    g = torch.Generator().manual_seed(seed + 1)
    files = sorted(out.glob("*.safetensors"))
    tensors = load_file(files[0])
    dt = next(iter(tensors.values())).dtype
    p = f"model.layers.{layers}"
    extra = {f"{p}.enorm.weight": 1 + 0.2 * torch.randn(h, generator=g),
             f"{p}.hnorm.weight": 1 + 0.2 * torch.randn(h, generator=g),
             f"{p}.eh_proj.weight": torch.randn(h, 2 * h, generator=g) / (2 * h) ** 0.5,
             f"{p}.shared_head.norm.weight": 1 + 0.2 * torch.randn(h, generator=g),
             f"{p}.shared_head.head.weight": 0.1 * torch.randn(v, h, generator=g)}
    save_file({**tensors, **{k: t.to(dt) for k, t in extra.items()}}, files[0], metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.exists():
        idx = json.loads(index.read_text())
        idx["weight_map"].update({k: files[0].name for k in extra})
        index.write_text(json.dumps(idx, indent=2))
    cfg.update(num_hidden_layers=layers, num_nextn_predict_layers=1)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
