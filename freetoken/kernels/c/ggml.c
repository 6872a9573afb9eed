/* llama.cpp's block quantizations (FMT_GGML banks): dot products of raw GGUF rows with
 * activations quantized per 32 (int8 + fp32 scale, like llama.cpp's Q8_0 activations).
 *
 * A row's type comes per expert tensor (the bank's int32 type arrays); every type is reduced to
 * the same step: 32 weights as unsigned (Q4_0, MXFP4 offset +12, Q4_K, Q5_K, Q6_K) or signed
 * (Q8_0) bytes, an integer dot with the 32 int8 activations (vpdpbusd on AVX512-VNNI, else
 * maddubs+madd), one fma with weight scale x activation scale; the offsets of the unsigned
 * codes (Q4_0's 8, MXFP4's 12, the k-quants' mins, Q6_K's 32) are removed once per 32 (per 16
 * for Q6_K) with the activation block sums from prep. Types and layouts: weights/ggml_quants.py. */
#include "ft_kernels.h"

enum { GT_Q4_0 = 2, GT_Q8_0 = 8, GT_Q4_K = 12, GT_Q5_K = 13, GT_Q6_K = 14, GT_MXFP4 = 39 };

/* Prepared activations: int8 q[n] (natural order) | float d[n/32] | float s16[n/16] where
 * s16[g] = d * sum of the 16 q of group g (the offset corrections). */
void ggml_prep(const float *src, uint8_t *dst, int n, int j0, int j1) {
    int8_t *q = (int8_t *)dst;
    float *d = (float *)(dst + n), *s16 = d + n / 32;
    for (int b = j0 / 32; b < j1 / 32; b++) {
        const float *x = src + b * 32;
        float amax = 0.f;
        for (int i = 0; i < 32; i++) { float a = fabsf(x[i]); amax = a > amax ? a : amax; }
        float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 32; i++) {
            int v = (int)nearbyintf(x[i] * id);
            q[b * 32 + i] = (int8_t)v;
            if (i < 16) s0 += v; else s1 += v;
        }
        d[b] = dd; s16[2 * b] = (float)s0 * dd; s16[2 * b + 1] = (float)s1 * dd;
    }
}

static inline float h2f(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return f16_to_f32(h); }
static inline float e8m0_half(uint8_t e) {   /* 2^(e-128), ggml_e8m0_to_fp32_half */
    uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23; float f; memcpy(&f, &u, 4); return f;
}
static inline void kscales(const uint8_t *s, uint8_t *sc, uint8_t *m) {   /* Q4_K/Q5_K 6-bit scales */
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63; m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

typedef struct { const int8_t *q; const float *d, *s16; } xview;
static inline xview xv(const uint8_t *p, int n) {
    xview v = {(const int8_t *)p, (const float *)(p + n), (const float *)(p + n) + n / 32};
    return v;
}
static inline float sum32(const xview *x, int b) { return x->s16[2 * b] + x->s16[2 * b + 1]; }

#ifdef FT_AVX2

/* acc[t] += dot(w, x_t block b) * scale * dx_t[b] for the 32 weights `wv` (unsigned bytes, or
 * |w| with signs moved onto x when `sgn`) and a per-half weight scale (lanes 0-3, 4-7). */
#define ACC32(wv, sgnv, b, sc)                                                                   \
    for (int t = 0; t < NT; t++) {                                                               \
        __m256i xq = _mm256_loadu_si256((const __m256i *)(X[t].q + 32 * (b)));                    \
        __m256i p = dot_u8s8(wv, sgnv ? _mm256_sign_epi8(xq, sgnv_v) : xq);                     \
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sc, _mm256_set1_ps(X[t].d[b])), acc[t]); \
    }

FORCE_INLINE void grow(const int type, const uint8_t *w, int n, const xview *X, float *res, const int NT) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3);
    const __m256i lutu = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                          12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    __m256 acc[NTMAX];
    float corr[NTMAX];
    __m256i sgnv_v = _mm256_setzero_si256();
    for (int t = 0; t < NT; t++) { acc[t] = _mm256_setzero_ps(); corr[t] = 0.f; }
    const int nb = n / 32;
    if (type == GT_Q8_0 || type == GT_Q4_0 || type == GT_MXFP4) {
        const int bs = type == GT_Q8_0 ? 34 : type == GT_Q4_0 ? 18 : 17;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = w + (int64_t)bs * b;
            PREFETCH(blk);
            if (type == GT_Q8_0) {
                sgnv_v = _mm256_loadu_si256((const __m256i *)(blk + 2));
                __m256i av = _mm256_abs_epi8(sgnv_v);
                __m256 sc = _mm256_set1_ps(h2f(blk));
                ACC32(av, 1, b, sc)
            } else {
                const int q40 = type == GT_Q4_0;
                __m128i q = _mm_loadu_si128((const __m128i *)(blk + (q40 ? 2 : 1)));
                __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
                __m256i wv = q40 ? nib : _mm256_shuffle_epi8(lutu, nib);
                const float dw = q40 ? h2f(blk) : e8m0_half(blk[0]), off = q40 ? 8.f : 12.f;
                __m256 sc = _mm256_set1_ps(dw);
                ACC32(wv, 0, b, sc)
                for (int t = 0; t < NT; t++) corr[t] += off * dw * sum32(&X[t], b);
            }
        }
    } else if (type == GT_Q4_K || type == GT_Q5_K) {
        const int q5 = type == GT_Q5_K, bs = q5 ? 176 : 144;
        for (int sb = 0; sb < n / 256; sb++) {
            const uint8_t *blk = w + (int64_t)bs * sb, *qs = blk + (q5 ? 48 : 16);
            PREFETCH(blk); PREFETCH(blk + 64); PREFETCH(blk + 128);
            const float d = h2f(blk), dmin = h2f(blk + 2);
            uint8_t sc[8], mn[8];
            kscales(blk + 4, sc, mn);
            __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (q5) {
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m1), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), m1), 4));
                }
                const int b0 = 8 * sb + 2 * c;
                __m256 s0 = _mm256_set1_ps(d * sc[2 * c]), s1 = _mm256_set1_ps(d * sc[2 * c + 1]);
                ACC32(lo, 0, b0, s0)
                ACC32(hi, 0, b0 + 1, s1)
                for (int t = 0; t < NT; t++)
                    corr[t] += dmin * ((float)mn[2 * c] * sum32(&X[t], b0) + (float)mn[2 * c + 1] * sum32(&X[t], b0 + 1));
            }
        }
    } else if (type == GT_Q6_K) {
        for (int sb = 0; sb < n / 256; sb++) {
            const uint8_t *blk = w + (int64_t)210 * sb;
            PREFETCH(blk); PREFETCH(blk + 64); PREFETCH(blk + 128); PREFETCH(blk + 192);
            const int8_t *scs = (const int8_t *)(blk + 192);
            const float d = h2f(blk + 208);
            for (int h = 0; h < 2; h++) {
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                __m256i qv[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                 _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                 _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
                for (int s = 0; s < 4; s++) {
                    __m256i wv = _mm256_or_si256(qv[s], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m3), 4));
                    const int b = 8 * sb + 4 * h + s, g = 2 * b;
                    const float f0 = d * scs[g - 16 * sb], f1 = d * scs[g + 1 - 16 * sb];
                    __m256 scv = _mm256_set_m128(_mm_set1_ps(f1), _mm_set1_ps(f0));
                    ACC32(wv, 0, b, scv)
                    for (int t = 0; t < NT; t++) corr[t] += 32.f * (f0 * X[t].s16[g] + f1 * X[t].s16[g + 1]);
                }
            }
        }
    } else {
        for (int t = 0; t < NT; t++) res[t] = NAN;   /* unreachable: the executor checks types */
        return;
    }
    for (int t = 0; t < NT; t++) res[t] = hsum8(acc[t]) - corr[t];
}

#else /* portable: each 32-block dequantized to floats (as the reference), dot with int8 x */

/* Elements [32 b, 32 b + 32) of a row of `type` -> out (the values gguf.quants.dequantize gives). */
static void block32(int type, const uint8_t *w, int b, float *out) {
    if (type == GT_Q8_0 || type == GT_Q4_0 || type == GT_MXFP4) {
        static const int8_t E2M1_X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        const uint8_t *blk = w + (int64_t)(type == GT_Q8_0 ? 34 : type == GT_Q4_0 ? 18 : 17) * b;
        for (int i = 0; i < 32; i++) {
            if (type == GT_Q8_0) out[i] = (float)((const int8_t *)blk)[2 + i] * h2f(blk);
            else {
                uint8_t byte = blk[(type == GT_Q4_0 ? 2 : 1) + (i & 15)], v = i < 16 ? byte & 15 : byte >> 4;
                out[i] = type == GT_Q4_0 ? h2f(blk) * (float)(v - 8) : e8m0_half(blk[0]) * (float)E2M1_X2[v];
            }
        }
        return;
    }
    const int sb = b / 8, j = b % 8;
    if (type == GT_Q4_K || type == GT_Q5_K) {
        const int q5 = type == GT_Q5_K;
        const uint8_t *blk = w + (int64_t)(q5 ? 176 : 144) * sb, *qs = blk + (q5 ? 48 : 16);
        uint8_t sc[8], mn[8];
        kscales(blk + 4, sc, mn);
        const float dd = h2f(blk) * sc[j], dm = h2f(blk + 2) * mn[j];
        for (int i = 0; i < 32; i++) {
            uint8_t byte = qs[32 * (j / 2) + i];
            int v = (j & 1) ? byte >> 4 : byte & 15;
            if (q5) v |= ((blk[16 + i] >> j) & 1) << 4;
            out[i] = dd * (float)v - dm;
        }
        return;
    }
    /* Q6_K: block b = 8 sb + 4 h + s */
    const uint8_t *blk = w + (int64_t)210 * sb;
    const int h = j / 4, s = j % 4;
    const float d = h2f(blk + 208);
    for (int i = 0; i < 32; i++) {
        uint8_t l = blk[64 * h + 32 * (s & 1) + i];
        int v = ((s >= 2 ? l >> 4 : l & 15) | (((blk[128 + 32 * h + i] >> (2 * s)) & 3) << 4)) - 32;
        out[i] = (d * (float)((const int8_t *)(blk + 192))[8 * h + 2 * s + i / 16]) * (float)v;
    }
}

FORCE_INLINE void grow(const int type, const uint8_t *w, int n, const xview *X, float *res, const int NT) {
    float acc[NTMAX] = {0};
    float wf[32];
    for (int b = 0; b < n / 32; b++) {
        block32(type, w, b, wf);
        for (int t = 0; t < NT; t++) {
            float p = 0.f;
            for (int i = 0; i < 32; i++) p += wf[i] * (float)X[t].q[32 * b + i];
            acc[t] += p * X[t].d[b];
        }
    }
    for (int t = 0; t < NT; t++) res[t] = acc[t];
}
#endif

#define GROW_NT(type)                                                              \
    switch (nt) {                                                                  \
    case 1: grow(type, w, n, X, res, 1); break;                                    \
    case 2: grow(type, w, n, X, res, 2); break;                                    \
    case 3: grow(type, w, n, X, res, 3); break;                                    \
    default: grow(type, w, n, X, res, 4); break;                                   \
    }

static void ggml_row(int type, const uint8_t *w, int n, const xview *X, int nt, float *res) {
    switch (type) {
    case GT_Q8_0: GROW_NT(GT_Q8_0) break;
    case GT_Q4_0: GROW_NT(GT_Q4_0) break;
    case GT_MXFP4: GROW_NT(GT_MXFP4) break;
    case GT_Q4_K: GROW_NT(GT_Q4_K) break;
    case GT_Q5_K: GROW_NT(GT_Q5_K) break;
    case GT_Q6_K: GROW_NT(GT_Q6_K) break;
    default: for (int t = 0; t < nt; t++) res[t] = NAN;
    }
}

/* res[r][t] = <row wr[r] of type *(int32 *)sr[r], prepared x_t> (a tile may mix the gate and up
 * halves, which can differ in type). */
void ggml_dot_tile(const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                   const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {
    xview X[NTMAX];
    for (int t = 0; t < nt; t++) X[t] = xv(xp[t], n);
    for (int r = 0; r < R; r++) {
        int32_t type; memcpy(&type, sr[r], 4);
        ggml_row(type, wr[r], n, X, nt, res[r]);
    }
}
