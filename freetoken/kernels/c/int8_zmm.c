/* The int8-activation dot tiles (int8, mxfp4) in zmm registers: dots.c's qtile / mtile with two
 * weight rows in the two 256-bit halves of each register and the token's activations in both
 * (prep_range writes them twice over). Every half runs its row's ymm tile lane for lane (the same
 * integer sums, the same float operations in the same order, the same final sum), so a dot has the
 * ymm tile's bits in half the instructions. Faster only where the ymm tile is bound by issuing
 * instructions: on a Zen 4 (512-bit ops as two halves) it is bound by execution slots (vpdpbusd,
 * convert, permute and fma per block pair and token) and the zmm tile measured 0.87-0.94x (mxfp4),
 * 1.0x (int8). On when ft_int8_zmm (kernels/int8_tiles.py's calibration). */
#include "ft_kernels.h"

int ft_int8_zmm;

/* Switch the zmm tiles on (1) or off (0), or leave them (-1); returns the state in effect (0 where
 * the build has no AVX-512). */
int ft_set_int8_zmm(int on) {
#ifdef FT_AVX512
    if (on >= 0) ft_int8_zmm = on != 0;
#else
    (void)on;
    ft_int8_zmm = 0;
#endif
    return ft_int8_zmm;
}

#ifdef FT_AVX512

/* acc + the dots of 64 unsigned x signed byte pairs into 16 int32 lanes (4 products each) */
FORCE_INLINE __m512i dpbusd512(__m512i acc, __m512i u, __m512i s) {
#ifdef FT_VNNI
    return _mm512_dpbusd_epi32(acc, u, s);
#else   /* exact for our operands, as dots.c's maddubs path */
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

/* A zeroed register for a fresh vpdpbusd sum: the zero idiom each time (no execution slot), where
 * the compiler would copy one zero register with a vmovdqa32 that takes an execution slot. */
FORCE_INLINE __m512i zero512(void) {
    __m512i z;
    __asm__ volatile("vpxord %0, %0, %0" : "=v"(z));
    return z;
}

/* 32 bytes at a (low half) and b (high half) */
FORCE_INLINE __m512i load2x32(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
/* the 32 activation bytes of chunk c in both halves: prep_range writes each chunk twice over when the
 * zmm tiles are on (a plain load: broadcast loads cost the mxfp4 tile 6% more on a Zen 4) */
FORCE_INLINE __m512i ldx(const uint8_t *x, int c) { return _mm512_loadu_si512((const void *)(x + 64 * (int64_t)c)); }
FORCE_INLINE __m512 bcast8f(const float *a) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)a)));
}
FORCE_INLINE __m512 halves(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}
/* x with its bytes negated where w's are negative: _mm256_sign_epi8(x, w) wherever |w| != 0 */
FORCE_INLINE __m512i sign512(__m512i x, __m512i w) {
    return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
}
/* lane j of each half: the half's lane sel[j] (a ymm permutevar index on both halves) */
FORCE_INLINE __m512i idx2(__m256i sel) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(sel), _mm256_add_epi32(sel, _mm256_set1_epi32(8)), 1);
}
FORCE_INLINE void store_halves(__m512 acc, float *r0, float *r1) {
    *r0 = hsum8(_mm512_castps512_ps256(acc));
    *r1 = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

/* qtile: rows (w[2p], w[2p+1]) in pair p < P, NT tokens */
FORCE_INLINE void qtile_z(const uint8_t *const *wr, const uint8_t *const *sr, int n, const uint8_t *const *xp,
                          float (*res)[NTMAX], const int P, const int NT) {
    __m512 acc[2][NTMAX];
    for (int p = 0; p < P; p++)
        for (int t = 0; t < NT; t++) acc[p][t] = _mm512_setzero_ps();
    const int nb = n / 32;
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m512 d8[2][NTMAX];
        for (int t = 0; t < NT; t++) {
            const __m512 dx = bcast8f((const float *)(xp[t] + 2 * n) + b);
            for (int p = 0; p < P; p++)
                d8[p][t] = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)sr[2 * p] + b))),
                    _mm_loadu_si128((const __m128i *)((const uint16_t *)sr[2 * p + 1] + b)), 1)), dx);
        }
        for (int k = 0; k < 8; k++) {
            const __m512i sel = idx2(_mm256_set1_epi32(k));
            __m512i v[2], av[2];
            for (int p = 0; p < P; p++) {
                PREFETCH(wr[2 * p] + 32 * (b + k));
                PREFETCH(wr[2 * p + 1] + 32 * (b + k));
                v[p] = load2x32(wr[2 * p] + 32 * (b + k), wr[2 * p + 1] + 32 * (b + k));
                av[p] = _mm512_abs_epi8(v[p]);
            }
            for (int t = 0; t < NT; t++) {
                const __m512i x = ldx(xp[t], b + k);
                for (int p = 0; p < P; p++) {
                    const __m512i q = dpbusd512(zero512(), av[p], sign512(x, v[p]));
                    acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_permutexvar_ps(sel, d8[p][t]), acc[p][t]);
                }
            }
        }
    }
    for (; b < nb; b++) {
        for (int p = 0; p < P; p++) {
            const __m512i v = load2x32(wr[2 * p] + 32 * b, wr[2 * p + 1] + 32 * b), av = _mm512_abs_epi8(v);
            const float dw0 = _cvtsh_ss(((const uint16_t *)sr[2 * p])[b]), dw1 = _cvtsh_ss(((const uint16_t *)sr[2 * p + 1])[b]);
            for (int t = 0; t < NT; t++) {
                const float dx = ((const float *)(xp[t] + 2 * n))[b];
                const __m512i q = dpbusd512(zero512(), av, sign512(ldx(xp[t], b), v));
                const __m512 d = halves(_mm256_set1_ps(dw0 * dx), _mm256_set1_ps(dw1 * dx));
                acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, acc[p][t]);
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int t = 0; t < NT; t++) store_halves(acc[p][t], &res[2 * p][t], &res[2 * p + 1][t]);
}

/* 2^(s-128) of 8 e8m0 bytes of each row of a pair, as mtile's float bits (s-1)<<23 (s = 0 -> 0) */
FORCE_INLINE __m512 e8m0x16(const uint8_t *s0, const uint8_t *s1) {
    __m128i sb = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)s0), _mm_loadl_epi64((const __m128i *)s1));
    sb = _mm_subs_epu8(sb, _mm_set1_epi8(1));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(sb), 23));
}

/* mtile: rows (w[2p], w[2p+1]) in pair p < P, NT tokens */
FORCE_INLINE void mtile_z(const uint8_t *const *wr, const uint8_t *const *sr, int n, const uint8_t *const *xp,
                          float (*res)[NTMAX], const int P, const int NT) {
    const __m512i lutu = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[2][NTMAX];
    for (int p = 0; p < P; p++)
        for (int t = 0; t < NT; t++) acc[p][t] = _mm512_setzero_ps();
    const int nb = n / 32;
    int b = 0;
    for (; b + 8 <= nb; b += 8) {   /* mtile's 8-block steps (its offset correction: below) */
        __m512 d8[2][NTMAX];
        for (int p = 0; p < P; p++) {
            const __m512 dws = e8m0x16(sr[2 * p] + b, sr[2 * p + 1] + b);
            for (int t = 0; t < NT; t++) d8[p][t] = _mm512_mul_ps(dws, bcast8f((const float *)(xp[t] + 2 * n) + b));
        }
        for (int pr = 0; pr < 4; pr++) {
            const int bb = b + 2 * pr;
            const __m512i sel = idx2(_mm256_setr_epi32(2 * pr, 2 * pr, 2 * pr, 2 * pr, 2 * pr + 1, 2 * pr + 1,
                                                       2 * pr + 1, 2 * pr + 1));
            __m512i lo[2], hi[2];
            for (int p = 0; p < P; p++) {
                PREFETCH(wr[2 * p] + 16 * bb);
                PREFETCH(wr[2 * p + 1] + 16 * bb);
                const __m512i q = load2x32(wr[2 * p] + 16 * bb, wr[2 * p + 1] + 16 * bb);
                lo[p] = _mm512_shuffle_epi8(lutu, _mm512_and_si512(q, m4));
                hi[p] = _mm512_shuffle_epi8(lutu, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            }
            for (int t = 0; t < NT; t++) {
                const __m512i xl = ldx(xp[t], bb), xh = ldx(xp[t], bb + 1);
                for (int p = 0; p < P; p++) {
                    const __m512i q = dpbusd512(dpbusd512(zero512(), lo[p], xl), hi[p], xh);
                    acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_permutexvar_ps(sel, d8[p][t]), acc[p][t]);
                }
            }
        }
    }
    /* mtile's correction sum(c_b) over the same steps, in the same order, out of the hot loop */
    for (int p = 0; p < P; p++)
        for (int t = 0; t < NT; t++) {
            __m512 corr = _mm512_setzero_ps();
            for (int g = 0; g < b; g += 8)
                corr = _mm512_fmadd_ps(e8m0x16(sr[2 * p] + g, sr[2 * p + 1] + g),
                                       bcast8f((const float *)(xp[t] + 2 * n) + nb + g), corr);
            acc[p][t] = _mm512_sub_ps(acc[p][t], corr);
        }
    for (; b + 2 <= nb; b += 2) {
        for (int p = 0; p < P; p++) {
            const __m512i q = load2x32(wr[2 * p] + 16 * b, wr[2 * p + 1] + 16 * b);
            const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4));
            const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            const __m512i alo = _mm512_abs_epi8(lo), ahi = _mm512_abs_epi8(hi);
            const float a0 = E8M0_HALF[sr[2 * p][b]], a1 = E8M0_HALF[sr[2 * p][b + 1]];
            const float b0 = E8M0_HALF[sr[2 * p + 1][b]], b1 = E8M0_HALF[sr[2 * p + 1][b + 1]];
            for (int t = 0; t < NT; t++) {
                const float *dx = (const float *)(xp[t] + 2 * n) + b;
                const __m512i xl = ldx(xp[t], b), xh = ldx(xp[t], b + 1);
                const __m512i s = dpbusd512(dpbusd512(zero512(), alo, sign512(xl, lo)), ahi, sign512(xh, hi));
                const __m512 d = halves(_mm256_set_m128(_mm_set1_ps(a1 * dx[1]), _mm_set1_ps(a0 * dx[0])),
                                        _mm256_set_m128(_mm_set1_ps(b1 * dx[1]), _mm_set1_ps(b0 * dx[0])));
                acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[p][t]);
            }
        }
    }
    if (b < nb) {   /* unpaired last block, laid out [even | odd] */
        for (int p = 0; p < P; p++) {
            const __m128i q0 = _mm_loadu_si128((const __m128i *)(wr[2 * p] + 16 * b));
            const __m128i q1 = _mm_loadu_si128((const __m128i *)(wr[2 * p + 1] + 16 * b));
            const __m512i nib = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(_mm_srli_epi16(q0, 4), q0)),
                                   _mm256_set_m128i(_mm_srli_epi16(q1, 4), q1), 1), m4);
            const __m512i v = _mm512_shuffle_epi8(lut, nib), av = _mm512_abs_epi8(v);
            const float dw0 = E8M0_HALF[sr[2 * p][b]], dw1 = E8M0_HALF[sr[2 * p + 1][b]];
            for (int t = 0; t < NT; t++) {
                const float dx = ((const float *)(xp[t] + 2 * n))[b];
                const __m512i s = dpbusd512(zero512(), av, sign512(ldx(xp[t], b), v));
                acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), halves(_mm256_set1_ps(dw0 * dx), _mm256_set1_ps(dw1 * dx)),
                                            acc[p][t]);
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int t = 0; t < NT; t++) store_halves(acc[p][t], &res[2 * p][t], &res[2 * p + 1][t]);
}

#define ZQ_NT(F, P)                                                                      \
    switch (nt) {                                                                        \
    case 1: F(w, s, n, xp, r, P, 1); break;                                              \
    case 2: F(w, s, n, xp, r, P, 2); break;                                              \
    case 3: F(w, s, n, xp, r, P, 3); break;                                              \
    default: F(w, s, n, xp, r, P, 4); break;                                             \
    }
#define ZQ_TILES(F)                                                                      \
    static void F##_rows(const uint8_t *const *wr, const uint8_t *const *sr, int R, int n, \
                         const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {        \
        int i = 0;                                                                       \
        for (; i + 4 <= R; i += 4) {                                                     \
            const uint8_t *const *w = wr + i, *const *s = sr + i;                        \
            float (*r)[NTMAX] = res + i;                                                 \
            ZQ_NT(F, 2)                                                                  \
        }                                                                                \
        if (i < R) {    /* 1-3 rows left: pairs, the last one's second half a copy */    \
            const uint8_t *w[4], *s[4];                                                  \
            float r[4][NTMAX];                                                           \
            const int m = R - i, P = (m + 1) / 2;                                        \
            for (int q = 0; q < 2 * P; q++) { w[q] = wr[i + (q < m ? q : m - 1)]; s[q] = sr[i + (q < m ? q : m - 1)]; } \
            if (P == 2) { ZQ_NT(F, 2) } else { ZQ_NT(F, 1) }                             \
            for (int q = 0; q < m; q++)                                                  \
                for (int t = 0; t < nt; t++) res[i + q][t] = r[q][t];                    \
        }                                                                                \
    }
ZQ_TILES(qtile_z)
ZQ_TILES(mtile_z)

int int8_zmm_tile(int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                  const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {
    if (fmt == FMT_INT8) { qtile_z_rows(wr, sr, R, n, xp, nt, res); return 1; }
    if (fmt == FMT_MXFP4) { mtile_z_rows(wr, sr, R, n, xp, nt, res); return 1; }
    return 0;
}

#else

int int8_zmm_tile(int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                  const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {
    (void)fmt, (void)wr, (void)sr, (void)R, (void)n, (void)xp, (void)nt, (void)res;
    return 0;
}

#endif
