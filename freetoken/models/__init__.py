"""The architectures: one short file per model family over `decoder.py` (the shared MoE decoder)
and `layers/`, named in `registry.py`; what a model gets from outside is in `context.py`."""
