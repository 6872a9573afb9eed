"""Checkpoint files read into tensors: safetensors directories, FTW (our own file) and GGUF; FTW
writing; the local model stores."""
