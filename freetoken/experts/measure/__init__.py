"""Measuring expert memory: bandwidth probes and profiles (B_P, B_H, B_D), the memory roofline, counters, the routing trace and its recorder."""
