"""Weight number formats as bits: pack and unpack llama.cpp's ggml blocks, FP8 (block-scaled),
int8 (Q8_0-sized), MXFP4 and NVFP4 in torch. Below every reader and executor: checkpoints
(weights/), expert banks (experts/) and dense layers (layers/) all speak these."""
