"""Routing-trace replay: trace readers, expert-cache policies, hardware projection, a model routed as a trace."""
