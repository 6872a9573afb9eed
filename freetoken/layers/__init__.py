"""Model building blocks over the kernels and the experts seam: attention variants over the paged
KV, dense and quantized linear layers, norms, rotary tables, the MoE block, recurrent states."""
