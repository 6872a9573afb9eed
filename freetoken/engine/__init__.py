"""The engine: requests in, one scheduler step at a time (paged KV, prefix cache, continuous
batching, sampling), outputs out; `EngineClient` (client.py) is all the layers above may call."""
