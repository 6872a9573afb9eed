"""The MTP ("nextn") drafter: the layer's forward against an independent torch reference built
from the DeepSeek-V3 paper's MTP module (and vLLM's description of it: embedding half first,
the embedding of position 0 zeroed, the module's output chained as the next hidden state) over
transformers' own decoder layer; greedy output with MTP drafts is plain decoding's, token for
token; the drafter's own KV after rejected drafts is as if they were never drafted; a
checkpoint without heads refuses `--speculative mtp` in one line.

transformers does not run MTP layers, so the tiny checkpoints are made with one decoder layer
more than the config says (that layer is the nextn layer's decoder block) plus the five nextn
tensors written here."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from freetoken import LLM, SamplingParams
from freetoken.errors import FreeTokenError

BASES = {
    "deepseek_v3": ("DeepseekV3Config", dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
        topk_group=2, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16)),
    "glm4_moe": ("Glm4MoeConfig", dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True,
        norm_topk_prob=True, partial_rotary_factor=0.5)),
}
LAYERS = 2
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


def ids_for(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def build(tiny_dir, tmp_path, arch, shared_head=True):
    """(checkpoint dir with one nextn layer, transformers model holding LAYERS + 1 layers)."""
    cls, base = BASES[arch]
    config = getattr(transformers, cls)(**base, num_hidden_layers=LAYERS + 1, eos_token_id=2, pad_token_id=0,
                                        bos_token_id=None, initializer_range=0.1, tie_word_embeddings=False,
                                        attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    for n, buf in model.named_buffers():       # zeros at init: a bias that changes the choice
        if n.endswith("e_score_correction_bias"):
            buf.uniform_(-0.05, 0.05)
    out = tmp_path / arch
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir("qwen3_moe") / f, out / f)
    h, v = base["hidden_size"], base["vocab_size"]
    p = f"model.layers.{LAYERS}"
    extra = {f"{p}.enorm.weight": 1 + 0.2 * torch.randn(h), f"{p}.hnorm.weight": 1 + 0.2 * torch.randn(h),
             f"{p}.eh_proj.weight": 0.1 * torch.randn(h, 2 * h),
             f"{p}.shared_head.norm.weight": 1 + 0.2 * torch.randn(h),
             f"{p}.embed_tokens.weight": model.model.embed_tokens.weight.detach().clone()}
    if shared_head:
        extra[f"{p}.shared_head.head.weight"] = 0.1 * torch.randn(v, h)
    tensors = load_file(out / "model.safetensors")
    save_file({**tensors, **extra}, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(num_hidden_layers=LAYERS, num_nextn_predict_layers=1)
    (out / "config.json").write_text(json.dumps(cfg))
    model.config.num_hidden_layers = LAYERS          # the main model runs LAYERS layers
    return out, model, extra


@torch.no_grad()
def reference_mtp_logits(model, extra, ids: list[int], drafts: int = 1):
    """The MTP module over a whole sequence, no cache: row p from the main model's hidden state
    before its final norm at p and the embedding of token p+1 (zeroed at position 0), one causal
    pass of the nextn decoder layer, then the shared head. The last row chains `drafts` - 1
    times (its output as the next row's hidden state, its argmax as the next row's token).
    Returns (logits of rows 0..n-2 and the chained rows, the chained tokens)."""
    p = f"model.layers.{LAYERS}"
    captured = {}
    hook = model.model.norm.register_forward_hook(lambda m, a, o: captured.update(h=a[0][0]))
    model(torch.tensor([ids]))
    hook.remove()
    main_h = captured["h"]                                     # [n, H]
    layer = model.model.layers[LAYERS]
    eps = model.config.rms_norm_eps

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def run(hidden, tokens):
        n = len(tokens)
        emb = model.model.embed_tokens(torch.tensor(tokens))
        emb[0] = 0.0                                           # position 0 has no token before it
        x = torch.cat([rms(emb, extra[f"{p}.enorm.weight"]), rms(hidden, extra[f"{p}.hnorm.weight"])], -1)
        x = (x @ extra[f"{p}.eh_proj.weight"].T)[None]
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=model.model.rotary_emb(x, pos))
        out = (out[0] if isinstance(out, tuple) else out)[0]
        head = extra.get(f"{p}.shared_head.head.weight", model.lm_head.weight)
        return out, rms(out, extra[f"{p}.shared_head.norm.weight"]) @ head.T

    hidden, tokens, chained = main_h[:-1], list(ids[1:]), []
    for _ in range(drafts):
        out, logits = run(hidden, tokens)
        tok = int(logits[-1].argmax())
        chained.append(tok)
        hidden, tokens = torch.cat([hidden, out[-1:]]), tokens + [tok]
    return logits, chained


@pytest.mark.parametrize("arch", sorted(BASES))
def test_mtp_layer_matches_reference(tiny_dir, tmp_path, arch):
    from freetoken.engine.spec.mtp import MTPDrafter, _SeqState
    d, ref_model, extra = build(tiny_dir, tmp_path, arch)
    llm = LLM(str(d), dtype="float32", speculative="mtp")
    model = llm.engine.runner.model
    ids = ids_for(23)
    llm.score(ids)                                   # one forward: model.prenorm holds every position
    drafter = MTPDrafter(model.mtp)
    out = drafter._rows(_SeqState(), model.prenorm[:-1], ids[1:], 0)
    ours = model.mtp.logits(out)
    ref, _ = reference_mtp_logits(ref_model, extra, ids)
    scale = max(1.0, ref.abs().max().item())
    assert (ours - ref).abs().max().item() <= 1e-4 * scale


@pytest.mark.parametrize("arch", sorted(BASES))
def test_chained_drafts_match_reference(tiny_dir, tmp_path, arch):
    """Catch-up then chaining, through the drafter's own KV, drafts the reference's tokens."""
    from freetoken.engine.spec.mtp import MTPDrafter
    d, ref_model, extra = build(tiny_dir, tmp_path, arch, shared_head=arch == "deepseek_v3")
    llm = LLM(str(d), dtype="float32", speculative="mtp")
    model = llm.engine.runner.model
    ids = ids_for(17, seed=1)
    llm.score(ids)

    class Seq:
        request_id, num_computed = "s", 0
    drafter = MTPDrafter(model.mtp)
    drafter.take_hidden([(Seq, len(ids) - 1)], model.prenorm[:-1])   # the pending token is ids[-1]
    got = drafter.propose(ids, 4, key="s")
    assert list(got.tokens) == reference_mtp_logits(ref_model, extra, ids[:-1] + [ids[-1]], drafts=4)[1]


def test_greedy_identity_and_rollback(tiny_dir, tmp_path):
    """Greedy output with MTP drafts (every draft taken, pricing off) is plain decoding's, in a
    batch; and at every proposal the drafter's draft is the reference's over the sequence so
    far, so rows of rejected drafts never stay in its KV."""
    d, ref_model, extra = build(tiny_dir, tmp_path, "deepseek_v3")
    prompts = [ids_for(n, seed=n) for n in (9, 14, 21)]
    plain = [o.token_ids for o in LLM(str(d), dtype="float32", speculative="off").generate(prompts, GREEDY)]
    llm = LLM(str(d), dtype="float32", speculative="mtp", spec_max_draft=3)
    spec = llm.engine.spec
    spec.priced = False
    seen = []
    propose = spec.mtp.propose

    def recording(ctx, k, key=None):
        got = propose(ctx, k, key=key)
        if got is not None:
            seen.append((list(ctx), got.tokens))
        return got
    spec.mtp.propose = recording
    spec.drafters["mtp"] = spec.mtp
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == plain
    stats = spec.stats.summary()["mtp"]
    assert stats["drafts"] > 10 and stats["proposed_tokens"] > stats["drafts"]
    for ctx, tokens in seen[::3]:
        assert tuple(reference_mtp_logits(ref_model, extra, ctx, drafts=len(tokens))[1]) == tokens


def test_without_heads_refuses_in_one_line(tiny_dir):
    for arch in ("deepseek_v3", "qwen3_moe"):
        with pytest.raises(FreeTokenError) as e:
            LLM(str(tiny_dir(arch)), dtype="float32", speculative="mtp")
        msg = str(e.value)
        assert "\n" not in msg and "--speculative mtp" in msg and "multi-token-prediction" in msg, msg


def test_make_tiny_nextn_greedy_identity(tiny_dir):
    """`make-tiny --nextn` writes a checkpoint `--speculative mtp` drafts from (GLM-4.5 layout),
    and the drafts leave greedy output as plain decoding's."""
    d = tiny_dir("glm4_moe", nextn=1)
    prompts = [ids_for(n, seed=n) for n in (7, 12)]
    plain = [o.token_ids for o in LLM(str(d), dtype="float32", speculative="off").generate(prompts, GREEDY)]
    llm = LLM(str(d), dtype="float32", speculative="mtp", spec_max_draft=4)
    llm.engine.spec.priced = False
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == plain
    assert llm.engine.spec.stats.summary()["mtp"]["drafts"] > 5


@pytest.mark.parametrize("fp8", [False, True])
def test_priced_and_sampled_output_unchanged(tiny_dir, tmp_path, fp8):
    """With the price on (the drafter's measured seconds in it) and with seeded sampling, output
    is plain decoding's; FP8 block-scaled checkpoints (DeepSeek-V3 as shipped) load their nextn
    layer too."""
    from freetoken.quant.fp8 import quantize_checkpoint_fp8
    d, _, _ = build(tiny_dir, tmp_path, "deepseek_v3")
    if fp8:
        quantize_checkpoint_fp8(d)
    prompts = [ids_for(n, seed=n) for n in (8, 13)]
    sampled = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True)
    plain = LLM(str(d), dtype="float32", speculative="off")
    want = [[o.token_ids for o in plain.generate(prompts, p)] for p in (GREEDY, sampled)]
    llm = LLM(str(d), dtype="float32", speculative="mtp", spec_max_draft=3)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want[0]        # priced
    llm.engine.spec.priced = False
    assert [o.token_ids for o in llm.generate(prompts, sampled)] == want[1]
    assert llm.engine.spec.mtp.first_s is not None                              # its cost was measured
