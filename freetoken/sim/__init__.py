"""Routing-trace replay: trace readers, expert-cache policies, hardware projection."""
