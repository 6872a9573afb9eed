"""The disk tier: experts read from the model file into a host cache, run on the CPU (backend.py), and its share of the memory plan (plan.py)."""
