"""The memory plan: what every device holds, decided once at start (see plan.py)."""
