"""Prefix reuse: the radix tree over the paged KV, where hybrid models checkpoint their state, agents' anchors, and a model-free replay."""
