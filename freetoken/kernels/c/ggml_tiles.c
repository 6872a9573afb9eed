/* Prefill of routed experts stored as llama.cpp block types through the GEMM tiles (gemm_bf16.c).
 *
 * The dot tiles (ggml.c, ggml_iq.c) decode every weight block once per <= 4 tokens: with 64
 * tokens on an expert (a 512-token prompt, top-8 of 64) each block is decoded 16 times, grid
 * lookups included for the i-quants. Here, for an expert with at least ft_ggml_group_min tokens
 * in a call of at least ft_gemm_min tokens, each thread decodes its 32 weight rows ONCE into a bf16
 * panel (the values gguf.quants.dequantize gives, rounded to bf16) and runs the bf16 tiles
 * (AMX / vdpbf16ps / plain C) of all the expert's tokens over it, x and h rounded to bf16 as
 * the bf16 experts' tiles round them (moe.c). Decode steps (calls under ft_gemm_min tokens) never
 * come here: their rows keep the int8 dots' bits whatever the batch. */
#include "ft_kernels.h"

int ft_ggml_tiles, ft_ggml_group_min = 16;

/* The ggml experts' tiles: `mode` (FT_GEMM_*, 0 off) for experts with >= group_min tokens in a
 * call of >= ft_gemm_min (ft_set_gemm's) tokens; llama.cpp's numerics (ft_set_ggml_act 1) keep the
 * dots. Returns the mode in effect (0 where `mode` does not run here). */
int ft_set_ggml_tiles(int mode, int group_min) {
    ft_ggml_tiles = mode && gemm_mode_runs(mode, 256) ? mode : 0;
    ft_ggml_group_min = group_min > 1 ? group_min : 1;
    return ft_ggml_tiles;
}

/* Rows [r0, r1) of `type` (K elements, rs bytes apart) -> bf16 rows of kpad(K) at pan (padding zeroed;
 * a type without kernels: NaN, as the dots). */
void ggml_panel(int type, const uint8_t *w, int64_t rs, int r0, int r1, int K, uint16_t *pan) {
    const int64_t ld = kpad(K);
    for (int r = r0; r < r1; r++) {
        uint16_t *d = pan + (int64_t)(r - r0) * ld;
        const uint8_t *row = w + (int64_t)r * rs;
        if (!ggml_iq_row_bf16(type, row, K, d) && !ggml_row_bf16(type, row, K, d))
            for (int k = 0; k < K; k++) d[k] = 0x7fc0;
        if (ld > K) memset(d + K, 0, (size_t)(ld - K) * 2);
    }
}

/* rows [0, rows) of `type` -> bf16 [rows, K] (out): the panel's decode on its own, for the tests. */
void ft_ggml_rows_bf16(int type, const void *w, int64_t rs, int rows, int K, uint16_t *out) {
    for (int r = 0; r < rows; r++) {
        uint16_t *d = out + (int64_t)r * K;
        const uint8_t *row = (const uint8_t *)w + (int64_t)r * rs;
        if (!ggml_iq_row_bf16(type, row, K, d) && !ggml_row_bf16(type, row, K, d))
            for (int k = 0; k < K; k++) d[k] = 0x7fc0;
    }
}
