import pytest
import torch

from freetoken.layers.attention.paged import AttentionMetadata, KVCache
from freetoken.layers.attention.sinks import paged_attention_sinks


class _Mod:
    def __init__(self, sinks, groups):
        self.sinks, self.num_key_value_groups, self.training = sinks, groups, False


@pytest.mark.parametrize("window", [None, 5])
def test_sinks_match_transformers_eager(window):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    torch.manual_seed(0)
    t, hq, hkv, d = 13, 4, 2, 8
    q, k, v = torch.randn(t, hq, d), torch.randn(t, hkv, d), torch.randn(t, hkv, d)
    sinks = torch.randn(hq)
    pos = torch.arange(t)
    mask = pos[None, :] <= pos[:, None]
    if window:
        mask &= pos[None, :] > pos[:, None] - window
    bias = torch.zeros(t, t).masked_fill(~mask, float("-inf"))[None, None]
    ref, _ = eager_attention_forward(_Mod(sinks, hq // hkv), q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                     v.transpose(0, 1)[None], bias, scaling=d ** -0.5)
    # two sequences in one step: the same tokens as a 13-token prefill and as a 1-token decode
    cache = KVCache(64, hkv, d, torch.float32, "cpu")
    slots = torch.arange(16, 16 + t)
    meta = AttentionMetadata(slot_mapping=slots, key_slots=slots[None], key_positions=pos[None],
                             query_index=torch.arange(t)[None], query_positions=pos[None], num_tokens=t)
    out = paged_attention_sinks(q, k, v, cache, meta, d ** -0.5, sinks, window)
    torch.testing.assert_close(out, ref[0], atol=1e-5, rtol=1e-5)
