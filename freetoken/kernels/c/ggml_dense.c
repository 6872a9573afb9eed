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

static inline float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return f16_to_f32(h); }
static inline float e8m0_half(uint8_t e) {   /* 2^(e-128) */
    uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23; float f; memcpy(&f, &u, 4); return f;
}

static const float IQ4_NL_V[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* 32 codes of a Q4_1/Q5_0/Q5_1 block: nibbles (element i < 16: low of qs[i], else high of
 * qs[i - 16]), plus bit i of the little-endian u32 qh as bit 4 when qh is given. */
static inline void codes32(const uint8_t *qs, const uint8_t *qh, int *q) {
    uint32_t h = 0;
    if (qh) memcpy(&h, qh, 4);
    for (int i = 0; i < 16; i++) {
        q[i] = (qs[i] & 15) | (int)(((h >> i) & 1) << 4);
        q[i + 16] = (qs[i] >> 4) | (int)(((h >> (i + 16)) & 1) << 4);
    }
}

/* Q3_K's 16 signed 6-bit scales from its 12 bytes */
static inline void q3_scales(const uint8_t *s, int *sc) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (lo | hi << 4) - 32;
    }
}

/* Row of `type` with K elements -> out (fp32). */
void ggml_dequant_row(int type, const uint8_t *w, int K, float *out) {
    static const float E2M1_X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    int q[32];
    switch (type) {
    case GT_Q4_1:
    case GT_Q5_0:
    case GT_Q5_1:
    case GT_IQ4_NL: {   /* x = d q + m (Q4_1, Q5_1), d (q - 16) (Q5_0), d kvalues[q] (IQ4_NL) */
        const int bs = ggml_bytes256(type) / 8;
        for (int b = 0; b < K / 32; b++) {
            const uint8_t *blk = w + (int64_t)bs * b;
            const float d = h2f(blk);
            float *o = out + 32 * b;
            if (type == GT_IQ4_NL) {
                codes32(blk + 2, NULL, q);
                for (int i = 0; i < 32; i++) o[i] = d * IQ4_NL_V[q[i]];
            } else if (type == GT_Q5_0) {
                codes32(blk + 6, blk + 2, q);
                for (int i = 0; i < 32; i++) o[i] = d * (float)(q[i] - 16);
            } else {
                const float m = h2f(blk + 2);
                codes32(blk + (type == GT_Q4_1 ? 4 : 8), type == GT_Q4_1 ? NULL : blk + 4, q);
                for (int i = 0; i < 32; i++) { const float p = d * (float)q[i]; o[i] = p + m; }
            }
        }
        return;
    }
    case GT_Q2_K:
    case GT_Q3_K:
    case GT_TQ2_0: {   /* 2-bit fields: element 128 h + 32 j + i = bits 2j of qs[32 h + i] */
        const int bs = ggml_bytes256(type);
        for (int sb = 0; sb < K / 256; sb++) {
            const uint8_t *blk = w + (int64_t)bs * sb;
            const uint8_t *qs = blk + (type == GT_Q2_K ? 16 : type == GT_Q3_K ? 32 : 0);
            int sc[16];
            if (type == GT_Q3_K) q3_scales(blk + 96, sc);
            for (int e = 0; e < 256; e++) {
                const int h = e / 128, j = (e / 32) % 4, i = e % 32, g = e / 16;
                const int c = (qs[32 * h + i] >> (2 * j)) & 3;
                float *o = out + 256 * sb + e;
                if (type == GT_Q2_K) {
                    const float dl = h2f(blk + 80) * (float)(blk[g] & 15), ml = h2f(blk + 82) * (float)(blk[g] >> 4);
                    const float p = dl * (float)c;
                    *o = p - ml;
                } else if (type == GT_Q3_K) {
                    const int hb = (blk[i] >> (e / 32)) & 1;
                    *o = (h2f(blk + 108) * (float)sc[g]) * (float)(c - (hb ? 0 : 4));
                } else {
                    *o = h2f(blk + 64) * (float)(c - 1);
                }
            }
        }
        return;
    }
    case GT_TQ1_0:   /* base-3: trit p of byte b is ((uint8)(b 3^p) * 3) >> 8 */
        for (int sb = 0; sb < K / 256; sb++) {
            const uint8_t *blk = w + (int64_t)54 * sb;
            const float d = h2f(blk + 52);
            for (int e = 0; e < 256; e++) {
                int byte, p;
                if (e < 160) { byte = blk[e % 32]; p = e / 32; }
                else if (e < 240) { byte = blk[32 + (e - 160) % 16]; p = (e - 160) / 16; }
                else { byte = blk[48 + (e - 240) % 4]; p = (e - 240) / 4; }
                static const int POW3[5] = {1, 3, 9, 27, 81};
                const int t = ((uint8_t)(byte * POW3[p]) * 3) >> 8;
                out[256 * sb + e] = d * (float)(t - 1);
            }
        }
        return;
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
        if (!ggml_bytes256(seg[i].type)) return -1;
        N += seg[i].rows;
        bytes += (int64_t)seg[i].rows * seg[i].rs;
    }
    if (N == 0) return 0;
    const ft_gemv_rows W = {FMT_GGML, NULL, 0, NULL, 0, seg, nseg};
    return gemv_run(p, &W, N, K, x, xt, M, bias, y, ldy, bytes);
}
