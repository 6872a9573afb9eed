"""Chat templates shipped with the package (the tiny models' Qwen template)."""
