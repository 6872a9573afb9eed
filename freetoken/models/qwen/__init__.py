"""The Qwen family: dense Qwen2/Qwen3, Qwen1.5/2-MoE, Qwen3-MoE, the hybrid Qwen3-Next and Qwen3.5/3.6-MoE."""
