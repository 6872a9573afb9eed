"""The DeepSeek family: V3/R1/Kimi-K2 (MLA), V3.2 (sparse attention), V4."""
