/* Dense layers in llama.cpp's block quantizations (GGUF attention / shared-expert / dense-FFN /
 * lm_head weights kept as the file stores them).
 *
 * A layer is a list of segments (ft_gseg), each rows of one ggml type lying at a fixed byte
 * stride (a tensor of the file): a fused projection such as qkv may mix
 * types (Q4_K_M stores some attn_v in Q6_K) without padding rows to a common width.
 *   ft_ggml_linear_run: y = x W^T (+ bias) for decode-sized x, dense.c's GEMV driver on ggml.c's
 *     dot tiles (activations int8 per 32 as llama.cpp's Q8 activations), threads on disjoint rows;
 *   ggml_dequant_row:   one row -> fp32, the values gguf.quants.dequantize gives (the prefill
 *     GEMMs and the expert banks' prefill path, via ft_dequant_rows in dequant.c). */
#include "ft_kernels.h"

/* exact operation order of the reference (no fused multiply-adds in the dequantization) */
#pragma GCC optimize("fp-contract=off")

enum { GT_Q4_0 = 2, GT_Q8_0 = 8, GT_Q4_K = 12, GT_Q5_K = 13, GT_Q6_K = 14, GT_MXFP4 = 39 };

static inline float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return f16_to_f32(h); }
static inline float e8m0_half(uint8_t e) {   /* 2^(e-128) */
    uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23; float f; memcpy(&f, &u, 4); return f;
}

/* Row of `type` with K elements -> out (fp32). */
void ggml_dequant_row(int type, const uint8_t *w, int K, float *out) {
    static const float E2M1_X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    switch (type) {
    case GT_Q8_0:
        for (int b = 0; b < K / 32; b++) {
            const uint8_t *blk = w + 34 * b;
            const float d = h2f(blk);
            for (int i = 0; i < 32; i++) out[32 * b + i] = (float)((const int8_t *)blk)[2 + i] * d;
        }
        return;
    case GT_Q4_0:
    case GT_MXFP4: {
        const int q4 = type == GT_Q4_0, bs = q4 ? 18 : 17;
        for (int b = 0; b < K / 32; b++) {
            const uint8_t *blk = w + bs * b, *qs = blk + (q4 ? 2 : 1);
            const float d = q4 ? h2f(blk) : e8m0_half(blk[0]);
            for (int i = 0; i < 16; i++) {
                const uint8_t v = qs[i];
                out[32 * b + i] = q4 ? d * (float)((v & 15) - 8) : d * E2M1_X2[v & 15];
                out[32 * b + 16 + i] = q4 ? d * (float)((v >> 4) - 8) : d * E2M1_X2[v >> 4];
            }
        }
        return;
    }
    case GT_Q4_K:
    case GT_Q5_K: {
        const int q5 = type == GT_Q5_K, bs = q5 ? 176 : 144;
        for (int sb = 0; sb < K / 256; sb++) {
            const uint8_t *blk = w + (int64_t)bs * sb, *s = blk + 4, *qs = blk + (q5 ? 48 : 16);
            const float d = h2f(blk), dmin = h2f(blk + 2);
            for (int j = 0; j < 8; j++) {
                int sc, m;
                if (j < 4) { sc = s[j] & 63; m = s[j + 4] & 63; }
                else { sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
                const float dd = d * (float)sc, dm = dmin * (float)m;
                float *o = out + 256 * sb + 32 * j;
                for (int i = 0; i < 32; i++) {
                    const uint8_t byte = qs[32 * (j / 2) + i];
                    int v = (j & 1) ? byte >> 4 : byte & 15;
                    if (q5) v |= ((blk[16 + i] >> j) & 1) << 4;
                    const float p = dd * (float)v;
                    o[i] = p - dm;
                }
            }
        }
        return;
    }
    case GT_Q6_K:
        for (int sb = 0; sb < K / 256; sb++) {
            const uint8_t *blk = w + (int64_t)210 * sb;
            const float d = h2f(blk + 208);
            for (int g = 0; g < 8; g++) {
                const int h = g / 4, s = g % 4;
                float *o = out + 256 * sb + 32 * g;
                for (int i = 0; i < 32; i++) {
                    const uint8_t l = blk[64 * h + 32 * (s & 1) + i];
                    const int v = ((s >= 2 ? l >> 4 : l & 15) | (((blk[128 + 32 * h + i] >> (2 * s)) & 3) << 4)) - 32;
                    o[i] = (d * (float)((const int8_t *)(blk + 192))[8 * h + 2 * s + i / 16]) * (float)v;
                }
            }
        }
        return;
    default:
        if (ggml_iq_dequant_row(type, w, K, out)) return;   /* the i-quants: ggml_iq.c */
        for (int k = 0; k < K; k++) out[k] = NAN;
    }
}

/* y [M, ldy] fp32 (columns 0..N-1, N = the segments' rows) = x [M, K] (fp32 or bf16) @ W^T + bias.
 * Returns 0, -1 for a type without a kernel, -2 when the scratch cannot be allocated. */
int ft_ggml_linear_run(void *vp, const ft_gseg *seg, int nseg, int K, const void *x, int xt, int64_t M,
                       const float *bias, float *y, int64_t ldy) {
    ft_pool *p = vp;
    int N = 0;
    int64_t bytes = 0;
    for (int i = 0; i < nseg; i++) {
        const int t = seg[i].type;
        if (t != GT_Q4_0 && t != GT_Q8_0 && t != GT_Q4_K && t != GT_Q5_K && t != GT_Q6_K && t != GT_MXFP4
            && !ggml_iq_type(t)) return -1;
        N += seg[i].rows;
        bytes += (int64_t)seg[i].rows * seg[i].rs;
    }
    if (N == 0) return 0;
    const ft_gemv_rows W = {FMT_GGML, NULL, 0, NULL, 0, seg, nseg};
    return gemv_run(p, &W, N, K, x, xt, M, bias, y, ldy, bytes);
}
