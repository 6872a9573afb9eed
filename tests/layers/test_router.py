"""DeepSeek-V3 / GLM-4.5 grouped sigmoid routing against transformers' own router module."""
import pytest
import torch
import transformers
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

from freetoken.layers.moe import grouped_sigmoid_topk


@pytest.mark.parametrize("experts,k,groups,topk_group,norm,scale", [
    (16, 4, 4, 2, True, 2.5), (16, 3, 1, 1, False, 1.0), (12, 2, 3, 1, True, 1.8), (8, 8, 2, 2, True, 1.0)])
def test_matches_transformers_router(experts, k, groups, topk_group, norm, scale):
    cfg = transformers.Glm4MoeConfig(hidden_size=32, n_routed_experts=experts, num_experts_per_tok=k,
                                     n_group=groups, topk_group=topk_group, norm_topk_prob=norm,
                                     routed_scaling_factor=scale)
    g = torch.Generator().manual_seed(experts * k)
    ref = Glm4MoeTopkRouter(cfg)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(experts, 32, generator=g))
        ref.e_score_correction_bias.copy_(torch.randn(experts, generator=g) * 0.3)
        logits, w_ref, ids_ref = ref(torch.randn(50, 32, generator=g))
    ids, w = grouped_sigmoid_topk(logits, ref.e_score_correction_bias, k, groups, topk_group, norm, scale)
    order_ref, order = ids_ref.sort(dim=-1), ids.sort(dim=-1)
    assert torch.equal(order.values, order_ref.values)
    torch.testing.assert_close(w.gather(1, order.indices), w_ref.gather(1, order_ref.indices), rtol=1e-6, atol=1e-7)


def test_bias_steers_selection_not_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    ids, w = grouped_sigmoid_topk(logits, torch.tensor([0.0, 0.0, 0.0, 5.0]), 1, 1, 1, False, 1.0)
    assert ids.tolist() == [[3]] and torch.allclose(w, torch.sigmoid(torch.tensor([[-1.0]])))
