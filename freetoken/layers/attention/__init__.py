"""Attention over the paged KV cache and its variants: prefill without a mask, flex on the device, sinks, MLA, DSA, gated, DeepSeek-V4's."""
