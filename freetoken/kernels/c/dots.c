/* Dot products: prepared activations (prep_range) and the dot tiles of every weight format,
 * dequantizing inside the dot product with fp32 accumulation. */
#include "ft_kernels.h"

const char *ft_isa(void) {
#if defined(FT_BF16DOT) && defined(FT_VNNI)
    return "avx512+vnni+bf16";
#elif defined(FT_AVX512) && defined(FT_VNNI)
    return "avx512+vnni";
#elif defined(FT_AVX512)
    return "avx512";
#elif defined(FT_AVX2)
    return "avx2";
#else
    return "portable";
#endif
}

__thread int64_t tl_pf;
float E8M0_HALF[256]; /* 2^(s-128): mxfp4 int8 lut holds 2*e2m1 */
pthread_once_t tables_once = PTHREAD_ONCE_INIT;
void init_tables(void) {
    for (int s = 0; s < 256; s++) {
        E8M0_HALF[s] = ldexpf(1.f, s - 128);
    }
}

/* Prepare elements [j0, j1) of the natural-order fp32 vector src into dst (block aligned). */
void prep_range(int fmt, const float *src, uint8_t *dst, int n, int j0, int j1) {
    if (fmt == FMT_GGML) {   /* a whole vector: the per-256 part too (moe.c's split h: after its barrier) */
        ggml_prep(src, dst, n, j0, j1);
        if (ft_ggml_k256 && j0 == 0 && j1 == n && n % 256 == 0) ggml_prep256(src, dst, n);
        return;
    }
    if (fmt == FMT_INT8 || fmt == FMT_MXFP4 || fmt == FMT_NVFP4) {
        /* the zmm tiles read every 32 bytes twice over (int8_zmm.c: both halves of a load) */
        const int dup = int8_zmm_on(fmt);
        int8_t *q = (int8_t *)dst;
        float *d = (float *)(dst + (dup ? 2 * n : n));
        for (int b = j0 / 32; b < j1 / 32; b++) {
            const float *x = src + b * 32;
            float amax = 0.f;
            for (int i = 0; i < 32; i++) { float a = fabsf(x[i]); amax = a > amax ? a : amax; }
            float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
            d[b] = dd;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                int j = b * 32 + i;
                int v = (int)nearbyintf(x[i] * id);
                sum += v;
                int at = fmt == FMT_INT8 ? j : perm_mxfp4(j, n);
                if (dup) { at = (at >> 5) * 64 + (at & 31); q[at + 32] = (int8_t)v; }
                q[at] = (int8_t)v;
                if (fmt == FMT_NVFP4 && i == 15) { d[n / 32 + 2 * b] = 12.f * (float)sum * dd; sum = 0; }
            }
            if (fmt == FMT_MXFP4) d[n / 32 + b] = 12.f * (float)sum * dd;  /* offset correction */
            if (fmt == FMT_NVFP4) d[n / 32 + 2 * b + 1] = 12.f * (float)sum * dd;  /* one per 16 */
        }
        return;
    }
    if (fmt == FMT_BF16 && ft_bf16_dot_on) {
        prep_bf16_pairs(src, dst, n, j0, j1);
        return;
    }
    float *o = (float *)dst;
    if (fmt == FMT_BF16) {
        int n16 = n & ~15;
        for (int j = j0; j < j1; j++) o[perm_bf16(j, n16)] = src[j];
    } else {
        memcpy(o + j0, src + j0, (size_t)(j1 - j0) * 4);
    }
}

/* ------------------------------------------------------------------ dot kernels
 * dot_FMT(w, s, n, xp, nt, res): res[t] = <row w (with its scales s), prepared x xp[t]>,
 * t < nt <= NTMAX.  s: fp8 -> float per 128 columns; mxfp4 -> e8m0 byte per 32;
 * int8 -> fp16 per 32. */

#ifdef FT_AVX2

/* Float-like formats: 16 weights at column i of a row -> two fp32 vectors matching the
 * prepared x at [i, i+8) and [i+8, i+16). fp8 weights come out multiplied by their block scale. */
FORCE_INLINE void fdecode16(const int fmt, const uint8_t *w, int i, __m256 *a, __m256 *b) {
    if (fmt == FMT_F32) {
        *a = _mm256_loadu_ps((const float *)w + i);
        *b = _mm256_loadu_ps((const float *)w + i + 8);
    } else if (fmt == FMT_F16) {
        *a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
        *b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i + 8)));
    } else if (fmt == FMT_BF16) {  /* even values -> a, odd -> b (x de-interleaved per 16) */
        __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
        *a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        *b = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
    } else { /* FMT_FP8: sign-extend, <<20, keep sign|exp|mant = value * 2^-120 (scaled by the caller) */
        const __m256i keep = _mm256_set1_epi32((int)0x87f00000u);
        __m256i v0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + i)));
        __m256i v1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + i + 8)));
        *a = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v0, 20), keep));
        *b = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v1, 20), keep));
    }
}

static inline float fdecode1(int fmt, const uint8_t *w, const uint8_t *s, int k) {
    if (fmt == FMT_FP8) return fp8_scaled(w[k]) * (((const float *)s)[k / 128] * TWO_POW_120);  /* fp8 tail block */
    return float_at(fmt, w, k);
}

/* The 2 x 4 tile's chain h (0: the first 8 of each 16-step, 1: the second, 2: both) into
 * acc[r][t][h]; returns the elements done (whole 16-steps). */
FORCE_INLINE int ftile24_half(const int fmt, const uint8_t *const *wr, int n, const uint8_t *const *xp,
                              __m256 (*acc)[NTMAX][2], const int h) {
    __m256 c[2][NTMAX], e[2][NTMAX];
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++) c[r][t] = e[r][t] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a0, b0, a1, b1;
        PREFETCH(wr[0] + i * (fmt == FMT_F32 ? 4 : 2));
        PREFETCH(wr[1] + i * (fmt == FMT_F32 ? 4 : 2));
        fdecode16(fmt, wr[0], i, &a0, &b0);
        fdecode16(fmt, wr[1], i, &a1, &b1);
        if (h != 1)
            for (int t = 0; t < 4; t++) {
                __m256 xa = _mm256_loadu_ps((const float *)xp[t] + i);
                c[0][t] = _mm256_fmadd_ps(a0, xa, c[0][t]);
                c[1][t] = _mm256_fmadd_ps(a1, xa, c[1][t]);
            }
        if (h != 0)
            for (int t = 0; t < 4; t++) {
                __m256 xb = _mm256_loadu_ps((const float *)xp[t] + i + 8);
                e[0][t] = _mm256_fmadd_ps(b0, xb, e[0][t]);
                e[1][t] = _mm256_fmadd_ps(b1, xb, e[1][t]);
            }
    }
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++) {
            if (h != 1) acc[r][t][0] = c[r][t];
            if (h != 0) acc[r][t][1] = e[r][t];
        }
    return i;
}

#ifdef __AVX512F__
/* fdecode16's two vectors as one: [a | b] (bf16: the word pairs broadcast to both halves, the
 * low words shifted up in the first, the high words masked in the second). */
FORCE_INLINE __m512 fdecode16z(const int fmt, const uint8_t *w, int i) {
    if (fmt == FMT_F32) return _mm512_loadu_ps((const float *)w + i);
    if (fmt == FMT_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
    v = _mm512_and_si512(v, _mm512_set_epi32(-65536, -65536, -65536, -65536, -65536, -65536, -65536, -65536,
                                             -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm512_castsi512_ps(_mm512_mask_slli_epi32(v, 0x00ff, v, 16));
}

/* ftile's float formats (not fp8) in zmm registers: lane j < 8 of a (row, token) accumulator is
 * ftile's first chain's lane j, lane 8 + j its second chain's, each summing the same products in
 * the same order, so every dot has ftile's bits in half the FMAs; R x NT up to 4 x 4 (16 of the
 * 32 registers), which a verify step's 2-9 rows run through without reloading the weights. */
FORCE_INLINE void ztile(const int fmt, const uint8_t *const *wr, int n, const uint8_t *const *xp,
                        float (*res)[NTMAX], const int R, const int NT) {
    __m512 acc[4][NTMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x[NTMAX];
        for (int t = 0; t < NT; t++) x[t] = _mm512_loadu_ps((const float *)xp[t] + i);
        for (int r = 0; r < R; r++) {
            PREFETCH(wr[r] + i * (fmt == FMT_F32 ? 4 : 2));
            const __m512 w = fdecode16z(fmt, wr[r], i);
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_fmadd_ps(w, x[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) {
            const __m256 lo = _mm512_castps512_ps256(acc[r][t]);
            const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][t]), 1));
            float v = hsum8(_mm256_add_ps(lo, hi));
            for (int k = i; k < n; k++) v += fdecode1(fmt, wr[r], NULL, k) * ((const float *)xp[t])[k];
            res[r][t] = v;
        }
}

#define ZTILE_NT(F, R)                                                           \
    switch (nt) {                                                                \
    case 1: ztile(F, wr, n, xp, res, R, 1); break;                               \
    case 2: ztile(F, wr, n, xp, res, R, 2); break;                               \
    case 3: ztile(F, wr, n, xp, res, R, 3); break;                               \
    default: ztile(F, wr, n, xp, res, R, 4); break;                              \
    }
/* dot_tile for the float formats: one zmm tile of R (<= 4) rows x nt tokens. */
#define ZTILE_CASES(F)                                                           \
    static void ztile_##F(const uint8_t *const *wr, int R, int n, const uint8_t *const *xp, int nt, \
                          float (*res)[NTMAX]) {                                 \
        switch (R) {                                                             \
        case 4: ZTILE_NT(F, 4); break;                                           \
        case 3: ZTILE_NT(F, 3); break;                                           \
        case 2: ZTILE_NT(F, 2); break;                                           \
        default: ZTILE_NT(F, 1); break;                                          \
        }                                                                        \
    }
ZTILE_CASES(FMT_F32)
ZTILE_CASES(FMT_BF16)
ZTILE_CASES(FMT_F16)
#endif

/* res[r][t] = <row r, x_t> for an R x NT tile; R*NT*2 independent accumulator chains. */
FORCE_INLINE void ftile(const int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int n,
                        const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    __m256 acc[4][NTMAX][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    int i = 0;
    if (fmt != FMT_FP8 && R == 2 && NT == 4) {
        /* prefill tile: 2 rows x 4 tokens sharing each activation load, with the general tiles'
         * two chains per (row, token) (the first and second 8 of each 16-step): a row's dot has
         * the same bits whatever tile it ran in (a verify step's k + 1 rows == k + 1 decode
         * steps). 16 accumulators fit AVX-512's 32 registers; AVX2's 16 take one chain a pass. */
#ifdef __AVX512F__
        i = ftile24_half(fmt, wr, n, xp, acc, 2);
#else
        ftile24_half(fmt, wr, n, xp, acc, 0);
        i = ftile24_half(fmt, wr, n, xp, acc, 1);
#endif
    } else if (fmt == FMT_FP8) {
        for (int b0 = 0; b0 + 128 <= n; b0 += 128) {
            __m256 p[4][NTMAX];
            for (int r = 0; r < R; r++)
                for (int t = 0; t < NT; t++) p[r][t] = _mm256_setzero_ps();
            for (i = b0; i < b0 + 128; i += 16) {
                __m256 xa[NTMAX], xb[NTMAX];
                for (int t = 0; t < NT; t++) {
                    xa[t] = _mm256_loadu_ps((const float *)xp[t] + i);
                    xb[t] = _mm256_loadu_ps((const float *)xp[t] + i + 8);
                }
                for (int r = 0; r < R; r++) {
                    __m256 a, b;
                    PREFETCH(wr[r] + i);
                    fdecode16(fmt, wr[r], i, &a, &b);
                    for (int t = 0; t < NT; t++) {
                        p[r][t] = _mm256_fmadd_ps(a, xa[t], p[r][t]);
                        acc[r][t][1] = _mm256_fmadd_ps(b, xb[t], acc[r][t][1]);
                    }
                }
            }
            for (int r = 0; r < R; r++) {
                __m256 sc = _mm256_set1_ps(((const float *)sr[r])[b0 / 128] * TWO_POW_120);
                for (int t = 0; t < NT; t++) {
                    acc[r][t][0] = _mm256_fmadd_ps(_mm256_add_ps(p[r][t], acc[r][t][1]), sc, acc[r][t][0]);
                    acc[r][t][1] = _mm256_setzero_ps();
                }
            }
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            __m256 xa[NTMAX], xb[NTMAX];
            for (int t = 0; t < NT; t++) {
                xa[t] = _mm256_loadu_ps((const float *)xp[t] + i);
                xb[t] = _mm256_loadu_ps((const float *)xp[t] + i + 8);
            }
            for (int r = 0; r < R; r++) {
                __m256 a, b;
                PREFETCH(wr[r] + i * (fmt == FMT_F32 ? 4 : 2));
                fdecode16(fmt, wr[r], i, &a, &b);
                for (int t = 0; t < NT; t++) {
                    acc[r][t][0] = _mm256_fmadd_ps(a, xa[t], acc[r][t][0]);
                    acc[r][t][1] = _mm256_fmadd_ps(b, xb[t], acc[r][t][1]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) {
            float v = hsum8(_mm256_add_ps(acc[r][t][0], acc[r][t][1]));
            for (int k = i; k < n; k++) v += fdecode1(fmt, wr[r], sr[r], k) * ((const float *)xp[t])[k];
            res[r][t] = v;
        }
}

FORCE_INLINE __m256i mxfp4_decode(const uint8_t *blk) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m128i q = _mm_loadu_si128((const __m128i *)blk);
    __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return _mm256_shuffle_epi8(lut, nib);
}

/* int8-activation formats (int8, mxfp4): per 32-block, int8 dot via the sign trick
 * (maddubs(|w|, sign(x, w))), then one fma with w_scale * x_scale. */
FORCE_INLINE void qtile(const int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int n,
                        const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    (void)fmt;  /* FMT_INT8: int8 weights, one fp16 scale per 32 */
    __m256 acc[4][NTMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    const int nb = n / 32;
    int b = 0;
    for (; b + 8 <= nb; b += 8) {   /* scales of 8 blocks at once: d = w_scale * x_scale */
        __m256 d8[4][NTMAX];
        for (int t = 0; t < NT; t++) {
            __m256 dx = _mm256_loadu_ps((const float *)(xp[t] + n) + b);
            for (int r = 0; r < R; r++)
                d8[r][t] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)sr[r] + b))), dx);
        }
        for (int k = 0; k < 8; k++) {
            const __m256i sel = _mm256_set1_epi32(k);
            __m256i x[NTMAX];
            for (int t = 0; t < NT; t++) x[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * (b + k)));
            for (int r = 0; r < R; r++) {
                PREFETCH(wr[r] + 32 * (b + k));
                __m256i v = _mm256_loadu_si256((const __m256i *)(wr[r] + 32 * (b + k)));
                __m256i av = _mm256_abs_epi8(v);
                for (int t = 0; t < NT; t++) {
                    __m256i p = dot_u8s8(av, _mm256_sign_epi8(x[t], v));
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_permutevar8x32_ps(d8[r][t], sel), acc[r][t]);
                }
            }
        }
    }
    for (; b < nb; b++) {
        __m256i x[NTMAX];
        float dx[NTMAX];
        for (int t = 0; t < NT; t++) {
            x[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * b));
            dx[t] = ((const float *)(xp[t] + n))[b];
        }
        for (int r = 0; r < R; r++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wr[r] + 32 * b));
            float dw = _cvtsh_ss(((const uint16_t *)sr[r])[b]);
            __m256i av = _mm256_abs_epi8(v);
            for (int t = 0; t < NT; t++) {
                __m256i p = dot_u8s8(av, _mm256_sign_epi8(x[t], v));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx[t]), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) res[r][t] = hsum8(acc[r][t]);
}

/* The low and high nibbles of q's 32 bytes through the 16-entry table lut (repeated in both
 * 128-bit lanes). With VBMI, vpermb reads an index's low 5 bits, so the 16 entries twice over
 * (lut as it is: both lanes equal) ignore the bit above each nibble: no masks (2 of the 5 ops a
 * block pair's decode took). */
FORCE_INLINE void nibbles_lut(__m256i q, __m256i lut, __m256i m4, __m256i *lo, __m256i *hi) {
#if defined(FT_AVX512) && defined(__AVX512VBMI__)
    (void)m4;
    *lo = _mm256_permutexvar_epi8(q, lut);
    *hi = _mm256_permutexvar_epi8(_mm256_srli_epi16(q, 4), lut);
#else
    *lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4));
    *hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
#endif
}

/* mxfp4: two blocks per 32-byte load; low nibbles of both blocks in one vector, high nibbles in
 * another; int8 dots as in qtile; the 4+4 int32 lanes of a block pair are scaled by
 * [d_b x4 | d_b+1 x4], with d = 2^(s-128) * x_scale computed 8 blocks at a time. */
FORCE_INLINE void mtile(const uint8_t *const *wr, const uint8_t *const *sr, int n,
                        const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4][NTMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    const int nb = n / 32;
    int b = 0;
    /* 8 blocks at a time: weights as unsigned 2*e2m1 + 12 (0..24), so maddubs takes the signed
     * activations directly; sum((w+12) x) - 12 sum(x) is corrected with c_b = 12 sum(x_b) dx_b
     * (from prep), one fma per 8 blocks. */
    const __m256i lutu = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                          12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    __m256 corr[4][NTMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) corr[r][t] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        __m256 dws[4];
        for (int r = 0; r < R; r++) {   /* 2^(s-128) as float bits (s-1)<<23; s = 0 -> 0 */
            __m128i sb = _mm_subs_epu8(_mm_loadl_epi64((const __m128i *)(sr[r] + b)), _mm_set1_epi8(1));
            dws[r] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(sb), 23));
        }
        __m256 d8[4][NTMAX];
        for (int t = 0; t < NT; t++) {
            __m256 dx = _mm256_loadu_ps((const float *)(xp[t] + n) + b);
            __m256 c8 = _mm256_loadu_ps((const float *)(xp[t] + n) + nb + b);
            for (int r = 0; r < R; r++) {
                d8[r][t] = _mm256_mul_ps(dws[r], dx);
                corr[r][t] = _mm256_fmadd_ps(dws[r], c8, corr[r][t]);
            }
        }
        for (int pr = 0; pr < 4; pr++) {
            const int bb = b + 2 * pr;
            const __m256i sel = _mm256_setr_epi32(2 * pr, 2 * pr, 2 * pr, 2 * pr, 2 * pr + 1, 2 * pr + 1, 2 * pr + 1, 2 * pr + 1);
            __m256i xl[NTMAX], xh[NTMAX];
            for (int t = 0; t < NT; t++) {
                xl[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * bb));
                xh[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * bb + 32));
            }
            for (int r = 0; r < R; r++) {
                PREFETCH(wr[r] + 16 * bb);
                __m256i q = _mm256_loadu_si256((const __m256i *)(wr[r] + 16 * bb));
                __m256i lo, hi;
                nibbles_lut(q, lutu, m4, &lo, &hi);
                for (int t = 0; t < NT; t++) {
                    __m256 pf = _mm256_cvtepi32_ps(dot2_u8s8(lo, xl[t], hi, xh[t]));
                    acc[r][t] = _mm256_fmadd_ps(pf, _mm256_permutevar8x32_ps(d8[r][t], sel), acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_sub_ps(acc[r][t], corr[r][t]);
    for (; b + 2 <= nb; b += 2) {
        __m256i xl[NTMAX], xh[NTMAX];
        for (int t = 0; t < NT; t++) {
            xl[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * b));
            xh[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * b + 32));
        }
        for (int r = 0; r < R; r++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(wr[r] + 16 * b));
            __m256i lo, hi;
            nibbles_lut(q, lut, m4, &lo, &hi);
            __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
            float d0 = E8M0_HALF[sr[r][b]], d1 = E8M0_HALF[sr[r][b + 1]];
            for (int t = 0; t < NT; t++) {
                const float *dx = (const float *)(xp[t] + n) + b;
                __m256 pf = _mm256_cvtepi32_ps(dot2_u8s8(alo, _mm256_sign_epi8(xl[t], lo), ahi, _mm256_sign_epi8(xh[t], hi)));
                __m256 d = _mm256_set_m128(_mm_set1_ps(d1 * dx[1]), _mm_set1_ps(d0 * dx[0]));
                acc[r][t] = _mm256_fmadd_ps(pf, d, acc[r][t]);
            }
        }
    }
    if (b < nb) {  /* unpaired last block, laid out [even | odd] */
        for (int r = 0; r < R; r++) {
            __m256i v = mxfp4_decode(wr[r] + 16 * b);
            __m256i av = _mm256_abs_epi8(v);
            float dw = E8M0_HALF[sr[r][b]];
            for (int t = 0; t < NT; t++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * b));
                float dx = ((const float *)(xp[t] + n))[b];
                __m256i p = dot_u8s8(av, _mm256_sign_epi8(x, v));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) res[r][t] = hsum8(acc[r][t]);
}


/* nvfp4: the byte layout of mxfp4 with a scale per 16 columns, so a 32-byte load (two 32-blocks
 * of columns, laid out like mxfp4's) holds four groups: int32 lanes 0-1, 2-3, 4-5, 6-7 of its
 * dot are groups 0..3, lanes 0-3 use the first block's activation scale, 4-7 the second's.
 * e4m3 scales decode exactly through the fp8 bit trick; the 2x of the int8 e2m1 table and the
 * 2^120 of the trick are folded into the row's global scale at the end. */
FORCE_INLINE __m256 e4m3x8(__m128i b8) {       /* 8 e4m3 bytes -> value * 2^-120 */
    __m256i u = _mm256_cvtepu8_epi32(b8);
    __m256i bits = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24),
                                   _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7f)), 20));
    return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(TWO_POW_120));
}

FORCE_INLINE void ntile(const uint8_t *const *wr, const uint8_t *const *sr, int n,
                        const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256i lutu = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                          12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i lo4 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), hi4 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    __m256 acc[4][NTMAX], corr[4][NTMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = corr[r][t] = _mm256_setzero_ps();
    const int nb = n / 32;
    int b = 0;
    /* 8 blocks (16 groups) at a time, weights as unsigned 2*e2m1 + 12 as in mtile; the offset is
     * corrected per group with c_g = 12 sum(x_g) dx (from prep). */
    for (; b + 8 <= nb; b += 8) {
        __m256 dws[4][2];
        for (int r = 0; r < R; r++) {
            __m128i sb = _mm_loadu_si128((const __m128i *)(sr[r] + 2 * b));
            dws[r][0] = e4m3x8(sb);
            dws[r][1] = e4m3x8(_mm_unpackhi_epi64(sb, sb));
        }
        __m256 d16[4][NTMAX][2];
        for (int t = 0; t < NT; t++) {
            const float *dxp = (const float *)(xp[t] + n);
            __m256 dx8 = _mm256_loadu_ps(dxp + b);
            __m256 dg0 = _mm256_permutevar8x32_ps(dx8, lo4), dg1 = _mm256_permutevar8x32_ps(dx8, hi4);
            __m256 c0 = _mm256_loadu_ps(dxp + nb + 2 * b), c1 = _mm256_loadu_ps(dxp + nb + 2 * b + 8);
            for (int r = 0; r < R; r++) {
                d16[r][t][0] = _mm256_mul_ps(dws[r][0], dg0);
                d16[r][t][1] = _mm256_mul_ps(dws[r][1], dg1);
                corr[r][t] = _mm256_fmadd_ps(dws[r][0], c0, corr[r][t]);
                corr[r][t] = _mm256_fmadd_ps(dws[r][1], c1, corr[r][t]);
            }
        }
        for (int pr = 0; pr < 4; pr++) {
            const int bb = b + 2 * pr;
            const __m256i sel = (pr & 1) ? hi4 : lo4;
            __m256i xl[NTMAX], xh[NTMAX];
            for (int t = 0; t < NT; t++) {
                xl[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * bb));
                xh[t] = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * bb + 32));
            }
            for (int r = 0; r < R; r++) {
                PREFETCH(wr[r] + 16 * bb);
                __m256i q = _mm256_loadu_si256((const __m256i *)(wr[r] + 16 * bb));
                __m256i lo, hi;
                nibbles_lut(q, lutu, m4, &lo, &hi);
                for (int t = 0; t < NT; t++) {
                    __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[t]), _mm256_maddubs_epi16(hi, xh[t]));
                    __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                    acc[r][t] = _mm256_fmadd_ps(pf, _mm256_permutevar8x32_ps(d16[r][t][pr >> 1], sel), acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_sub_ps(acc[r][t], corr[r][t]);
    for (; b < nb; b += 2) {   /* the rest: pairs of blocks, then an unpaired last one [even | odd] */
        const int pair = b + 2 <= nb;
        for (int r = 0; r < R; r++) {
            __m256i lo, hi;
            if (pair) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(wr[r] + 16 * b));
                nibbles_lut(q, lut, m4, &lo, &hi);
            } else {
                lo = mxfp4_decode(wr[r] + 16 * b);
                hi = _mm256_setzero_si256();
            }
            __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
            float g[4];
            for (int k = 0; k < (pair ? 4 : 2); k++) g[k] = fp8_scaled(sr[r][2 * b + k]) * TWO_POW_120;
            for (int t = 0; t < NT; t++) {
                const float *dx = (const float *)(xp[t] + n) + b;
                __m256 d;
                if (pair) {
                    __m256i xl = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * b));
                    __m256i xh = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * b + 32));
                    __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(alo, _mm256_sign_epi8(xl, lo)),
                                                   _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(xh, hi)));
                    __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                    d = _mm256_setr_ps(g[0] * dx[0], g[0] * dx[0], g[1] * dx[0], g[1] * dx[0],
                                       g[2] * dx[1], g[2] * dx[1], g[3] * dx[1], g[3] * dx[1]);
                    acc[r][t] = _mm256_fmadd_ps(pf, d, acc[r][t]);
                } else {   /* lanes 0-3: even columns of groups 0, 0, 1, 1; lanes 4-7: odd ones */
                    __m256i x = _mm256_loadu_si256((const __m256i *)(xp[t] + 32 * b));
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(alo, _mm256_sign_epi8(x, lo)), ones);
                    d = _mm256_setr_ps(g[0] * dx[0], g[0] * dx[0], g[1] * dx[0], g[1] * dx[0],
                                       g[0] * dx[0], g[0] * dx[0], g[1] * dx[0], g[1] * dx[0]);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const float gs = 0.5f * nvfp4_global(sr[r], n);
        for (int t = 0; t < NT; t++) res[r][t] = hsum8(acc[r][t]) * gs;
    }
}

FORCE_INLINE void tile(const int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int n,
                       const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    if (fmt == FMT_MXFP4) mtile(wr, sr, n, xp, res, R, NT);
    else if (fmt == FMT_NVFP4) ntile(wr, sr, n, xp, res, R, NT);
    else if (fmt == FMT_INT8) qtile(fmt, wr, sr, n, xp, res, R, NT);
    else ftile(fmt, wr, sr, n, xp, res, R, NT);
}

#else /* portable */

FORCE_INLINE void dot_float_body(const int fmt, const uint8_t *w, int n, const uint8_t *const *xp, float *res,
                                 const int NT) {
    for (int t = 0; t < NT; t++) {
        const float *x = (const float *)xp[t]; float r = 0.f;
        for (int k = 0; k < n; k++) r += float_at(fmt, w, k) * x[k];
        res[t] = r;
    }
}
FORCE_INLINE void dot_fp8_body(const uint8_t *w, const float *s, int n, const uint8_t *const *xp, float *res, const int NT) {
    for (int t = 0; t < NT; t++) {
        const float *x = (const float *)xp[t]; float r = 0.f;
        for (int b0 = 0; b0 < n; b0 += 128) {
            int b1 = b0 + 128 < n ? b0 + 128 : n; float p = 0.f;
            for (int k = b0; k < b1; k++) p += fp8_scaled(w[k]) * x[k];
            r += p * (s[b0 / 128] * TWO_POW_120);
        }
        res[t] = r;
    }
}
FORCE_INLINE void dot_int8_body(const uint8_t *w, const uint16_t *s, int n, const uint8_t *const *xp, float *res, const int NT) {
    for (int t = 0; t < NT; t++) {
        const int8_t *x = (const int8_t *)xp[t]; const float *dx = (const float *)(xp[t] + n);
        const int8_t *wi = (const int8_t *)w; float r = 0.f;
        for (int b = 0; b < n / 32; b++) {
            int32_t p = 0;
            for (int k = 0; k < 32; k++) p += (int32_t)wi[32 * b + k] * x[32 * b + k];
            r += (float)p * (f16_to_f32(s[b]) * dx[b]);
        }
        res[t] = r;
    }
}
static const int8_t E2M1_X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
FORCE_INLINE void dot_mxfp4_body(const uint8_t *w, const uint8_t *s, int n, const uint8_t *const *xp, float *res, const int NT) {
    for (int t = 0; t < NT; t++) {
        const int8_t *x = (const int8_t *)xp[t]; const float *dx = (const float *)(xp[t] + n); float r = 0.f;
        for (int b = 0; b < n / 32; b++) {
            int32_t p = 0;
            for (int k = 0; k < 16; k++) {
                uint8_t byte = w[16 * b + k];
                int j = 32 * b + 2 * k;
                p += E2M1_X2[byte & 15] * x[perm_mxfp4(j, n)] + E2M1_X2[byte >> 4] * x[perm_mxfp4(j + 1, n)];
            }
            r += (float)p * (E8M0_HALF[s[b]] * dx[b]);
        }
        res[t] = r;
    }
}
FORCE_INLINE void dot_nvfp4_body(const uint8_t *w, const uint8_t *s, int n, const uint8_t *const *xp, float *res, const int NT) {
    const float gs = 0.5f * nvfp4_global(s, n);
    for (int t = 0; t < NT; t++) {
        const int8_t *x = (const int8_t *)xp[t]; const float *dx = (const float *)(xp[t] + n); float r = 0.f;
        for (int g = 0; g < n / 16; g++) {
            int32_t p = 0;
            for (int k = 0; k < 8; k++) {
                uint8_t byte = w[8 * g + k];
                int j = 16 * g + 2 * k;
                p += E2M1_X2[byte & 15] * x[perm_mxfp4(j, n)] + E2M1_X2[byte >> 4] * x[perm_mxfp4(j + 1, n)];
            }
            r += (float)p * (fp8_scaled(s[g]) * TWO_POW_120 * dx[g / 2]);
        }
        res[t] = r * gs;
    }
}
static void dot_row(int fmt, const uint8_t *w, const uint8_t *s, int n, const uint8_t *const *xp, int nt, float *res) {
    switch (fmt) {
    case FMT_F32: dot_float_body(FMT_F32, w, n, xp, res, nt); break;
    case FMT_BF16: dot_float_body(FMT_BF16, w, n, xp, res, nt); break;
    case FMT_F16: dot_float_body(FMT_F16, w, n, xp, res, nt); break;
    case FMT_FP8: dot_fp8_body(w, (const float *)s, n, xp, res, nt); break;
    case FMT_INT8: dot_int8_body(w, (const uint16_t *)s, n, xp, res, nt); break;
    case FMT_MXFP4: dot_mxfp4_body(w, s, n, xp, res, nt); break;
    case FMT_NVFP4: dot_nvfp4_body(w, s, n, xp, res, nt); break;
    }
}
FORCE_INLINE void tile(const int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int n,
                       const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    for (int r = 0; r < R; r++) dot_row(fmt, wr[r], sr[r], n, xp, NT, res[r]);
}
#endif

/* res[r][t] = <row wr[r], x_t> for r < R (<= 4), t < nt (<= NTMAX). Tiles keep about eight
 * accumulator chains in flight: 4 rows x 1 token, 2 x 2, or 1 row x 3-4 tokens. */
#define TILE_CASES(F)                                                              \
    static void dot_tile_##F(const uint8_t *const *wr, const uint8_t *const *sr, int R, int n, \
                             const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {          \
        if (nt == 1) {                                                             \
            int r = 0;                                                             \
            for (; r + 4 <= R; r += 4) tile(F, wr + r, sr + r, n, xp, res + r, 4, 1); \
            for (; r < R; r++) tile(F, wr + r, sr + r, n, xp, res + r, 1, 1);      \
        } else if (nt == 2) {                                                      \
            int r = 0;                                                             \
            for (; r + 2 <= R; r += 2) tile(F, wr + r, sr + r, n, xp, res + r, 2, 2); \
            for (; r < R; r++) tile(F, wr + r, sr + r, n, xp, res + r, 1, 2);      \
        } else if (nt == 4 && F != FMT_FP8 && F != FMT_INT8 && F != FMT_MXFP4 && F != FMT_NVFP4) { \
            int r = 0;                                                             \
            for (; r + 2 <= R; r += 2) tile(F, wr + r, sr + r, n, xp, res + r, 2, 4); \
            for (; r < R; r++) tile(F, wr + r, sr + r, n, xp, res + r, 1, 4);      \
        } else {                                                                   \
            for (int r = 0; r < R; r++) {                                          \
                if (nt == 3) tile(F, wr + r, sr + r, n, xp, res + r, 1, 3);        \
                else tile(F, wr + r, sr + r, n, xp, res + r, 1, 4);                \
            }                                                                      \
        }                                                                          \
    }
TILE_CASES(FMT_F32)
TILE_CASES(FMT_BF16)
TILE_CASES(FMT_F16)
TILE_CASES(FMT_FP8)
TILE_CASES(FMT_MXFP4)
TILE_CASES(FMT_INT8)
TILE_CASES(FMT_NVFP4)

int wide_tiles(int fmt) {
#if defined(FT_AVX2) && defined(__AVX512F__)
    return int8_zmm_on(fmt) || fmt == FMT_F32 || fmt == FMT_F16 || (fmt == FMT_BF16 && !ft_bf16_dot_on);
#else
    (void)fmt;
    return 0;
#endif
}

void dot_tile(int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                     const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {
    if (int8_zmm_on(fmt) && int8_zmm_tile(fmt, wr, sr, R, n, xp, nt, res)) return;
#if defined(FT_AVX2) && defined(__AVX512F__)
    switch (fmt) {      /* the float formats' zmm tiles (ftile's bits) */
    case FMT_F32: ztile_FMT_F32(wr, R, n, xp, nt, res); return;
    case FMT_F16: ztile_FMT_F16(wr, R, n, xp, nt, res); return;
    case FMT_BF16: if (!ft_bf16_dot_on) { ztile_FMT_BF16(wr, R, n, xp, nt, res); return; } break;
    }
#endif
    switch (fmt) {
    case FMT_F32: dot_tile_FMT_F32(wr, sr, R, n, xp, nt, res); break;
    case FMT_BF16:
#ifdef FT_BF16DOT
        if (ft_bf16_dot_on) { dot_tile_bf16_pairs(wr, R, n, xp, nt, res); break; }
#endif
        dot_tile_FMT_BF16(wr, sr, R, n, xp, nt, res); break;
    case FMT_F16: dot_tile_FMT_F16(wr, sr, R, n, xp, nt, res); break;
    case FMT_FP8: dot_tile_FMT_FP8(wr, sr, R, n, xp, nt, res); break;
    case FMT_MXFP4: dot_tile_FMT_MXFP4(wr, sr, R, n, xp, nt, res); break;
    case FMT_INT8: dot_tile_FMT_INT8(wr, sr, R, n, xp, nt, res); break;
    case FMT_NVFP4: dot_tile_FMT_NVFP4(wr, sr, R, n, xp, nt, res); break;
    case FMT_GGML: ggml_dot_tile(wr, sr, R, n, xp, nt, res); break;
    }
}
