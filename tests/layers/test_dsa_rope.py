"""The DSA indexer's rope: half-split (DeepSeek-V3.2) and interleaved (GLM-5) give the
reference's query . key products (the interleaved keys are stored permuted)."""
import pytest
import torch
from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave

from freetoken.layers.attention.dsa import Indexer
from freetoken.layers.rope import Rotary


@pytest.mark.parametrize("interleave", [False, True])
def test_indexer_rope_preserves_reference_products(interleave):
    rope, dim, n = 8, 16, 7
    rotary = Rotary({"rope_theta": 10000.0}, rope, 64, torch.float32, "cpu")
    idx = object.__new__(Indexer)
    idx.rotary, idx.rope, idx.interleave = rotary, rope, interleave
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(n, 3, dim, generator=g), torch.randn(n, 1, dim, generator=g)
    pos = torch.arange(n)
    cos, sin = rotary.tables(pos)
    ours = torch.einsum("qhd,kd->qhk", idx._rope(q, cos, sin), idx._rope(k, cos, sin)[:, 0])
    ref_fn = apply_rotary_pos_emb_interleave if interleave else apply_rotary_pos_emb
    c, s = cos[:, 0][None], sin[:, 0][None]                 # [1, N, rope]
    qr, kr = ref_fn(q[None, ..., :rope], k[None, ..., :rope], c, s, unsqueeze_dim=2)
    qf, kf = torch.cat([qr[0], q[..., rope:]], -1), torch.cat([kr[0], k[..., rope:]], -1)
    torch.testing.assert_close(ours, torch.einsum("qhd,kd->qhk", qf, kf[:, 0]), atol=1e-5, rtol=1e-5)
