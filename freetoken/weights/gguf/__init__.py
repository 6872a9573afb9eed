"""GGUF files: the reader, metadata and names mapped to the Hugging Face layout, types, tokenizer, side files, a synthetic writer."""
