"""How routed experts run: the CPU kernels' executor, the torch reference, the resident and tiered backends, the device decode path, prefill."""
