"""`freetoken pull` / `freetoken run`: models from the Hugging Face Hub and the Ollama registry
into their standard local stores (which `weights/stores.py` resolves for `--model`)."""
