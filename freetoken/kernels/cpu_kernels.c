/* The C kernels of the pure-CPU engine. Mainly CPU expert execution: out[t] += sum_k w[t,k] *
 * down(act(gate(x[t])) * up(x[t])) for routed experts, streaming the weights straight from the
 * host pool banks and dequantizing inside the dot products (fp32 accumulation). Further down,
 * on the same dot tiles and thread pool: the dense GEMV (ft_linear_run), row dequantization for
 * prefill GEMMs (ft_dequant_rows), decode attention over the paged KV cache
 * (ft_decode_attention), and two per-op helpers run on the calling thread (ft_rms_norm, ft_rope).
 *
 * Built at first use by freetoken/kernels/__init__.py with the system C compiler and
 * -march=native, so the preprocessor picks the widest SIMD path the machine has:
 *   FT_AVX2:     AVX2 + FMA + F16C (x86-64 since Haswell / Zen 1; also used on AVX-512 CPUs)
 *   otherwise:   portable C (any architecture; the compiler vectorises what it can)
 *
 * Work split: a persistent pool of pinned threads. Phase 1 gives every thread a disjoint,
 * 32-aligned range of the intermediate index j and runs it for all routed experts (gate row j
 * and up row I+j), phase 2 a disjoint range of output rows of `down`. So each core streams its
 * own weight rows, and no two threads write the same output element.
 *
 * Activations are prepared once per call in the layout each format's kernel wants:
 *   f32/f16/fp8: fp32;  bf16: fp32, even/odd de-interleaved per 16;
 *   int8/mxfp4:  int8 per 32-block + fp32 block scale (like llama.cpp's Q8_0 activations);
 *                for mxfp4 the int8 values are de-interleaved to match the low/high nibbles
 *                of two blocks loaded at once (perm_mxfp4).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(FT_PORTABLE)
#define FT_AVX2 1
#include <immintrin.h>
#endif

enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_F16 = 2, FMT_FP8 = 3, FMT_MXFP4 = 4, FMT_INT8 = 5 };
enum { ACT_SILU = 0, ACT_SWIGLU_OAI = 1, ACT_SILU_CLAMP = 2 };
enum { XT_F32 = 0, XT_BF16 = 1 };
#define NTMAX 4
#define RB 32   /* weight rows per cache block when many tokens share an expert */
/* Software prefetch of the same position in the rows of the next tile (tl_pf bytes further):
 * a tile reads its rows in lockstep, so prefetching one tile ahead keeps every stream fed. */
static __thread int64_t tl_pf;
#define PREFETCH(p) __builtin_prefetch((const char *)(p) + tl_pf, 0, 2)

typedef struct {
    int32_t fmt, act, H, I;
    float alpha, limit;
    int64_t n_experts;
    const uint8_t *gu_w; int64_t gu_w_es, gu_w_rs;   /* base, bytes per expert, bytes per row */
    const uint8_t *gu_s; int64_t gu_s_es, gu_s_rs;   /* scales (fp8: per 128 rows) */
    const uint8_t *dn_w; int64_t dn_w_es, dn_w_rs;
    const uint8_t *dn_s; int64_t dn_s_es, dn_s_rs;
    const float *gu_b, *dn_b;                        /* [N, 2I], [N, H] or NULL */
} ft_desc;

const char *ft_isa(void) {
#ifdef FT_AVX2
    return "avx2";
#else
    return "portable";
#endif
}

/* ------------------------------------------------------------------ scalar helpers */

static float E8M0_HALF[256]; /* 2^(s-128): mxfp4 int8 lut holds 2*e2m1 */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static void init_tables(void) {
    for (int s = 0; s < 256; s++) {
        E8M0_HALF[s] = ldexpf(1.f, s - 128);
    }
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return s ? -f : f;
    }
    if (e == 31) u = s | 0x7f800000 | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}
/* e4m3fn byte -> fp32 bits of value * 2^-120 (exact, subnormals included). */
static inline float fp8_scaled(uint8_t b) {
    uint32_t u = ((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7f) << 20);
    float f; memcpy(&f, &u, 4); return f;
}
#define TWO_POW_120 1.329227995784916e+36f

/* Element k of a row of fp32 / bf16 / fp16 values (XT_F32/XT_BF16 share these codes). */
static inline float float_at(int fmt, const uint8_t *w, int64_t k) {
    if (fmt == FMT_F32) return ((const float *)w)[k];
    if (fmt == FMT_BF16) return bf16_to_f32(((const uint16_t *)w)[k]);
    return f16_to_f32(((const uint16_t *)w)[k]);
}

static inline int perm_bf16(int j, int n16) {  /* position of element j in the prepared vector */
#ifdef FT_AVX2
    if (j < n16) { int q = j & 15; return (j & ~15) + (q & 1) * 8 + (q >> 1); }
#endif
    (void)n16; return j;
}
/* mxfp4 activations: per pair of 32-blocks [even of b | even of b+1 | odd of b | odd of b+1]
 * (matching low / high nibbles of a 32-byte load of two blocks); an unpaired last block is
 * [even | odd]. */
static inline int perm_mxfp4(int j, int n) {
    int b = j >> 5, q = j & 31, nb = n >> 5;
    if ((nb & 1) && b == nb - 1) return (b << 5) + (q & 1) * 16 + (q >> 1);
    return ((b >> 1) << 6) + (q & 1) * 32 + (b & 1) * 16 + (q >> 1);
}

/* Prepared-activation layout for a vector of length n. */
static inline int64_t prep_bytes(int n) { return (int64_t)n * 4; }

/* Prepare elements [j0, j1) of the natural-order fp32 vector src into dst (block aligned). */
static void prep_range(int fmt, const float *src, uint8_t *dst, int n, int j0, int j1) {
    if (fmt == FMT_INT8 || fmt == FMT_MXFP4) {
        int8_t *q = (int8_t *)dst;
        float *d = (float *)(dst + n);
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
                q[fmt == FMT_MXFP4 ? perm_mxfp4(j, n) : j] = (int8_t)v;
            }
            if (fmt == FMT_MXFP4) d[n / 32 + b] = 12.f * (float)sum * dd;  /* offset correction */
        }
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

#define FORCE_INLINE static inline __attribute__((always_inline))

#ifdef FT_AVX2
FORCE_INLINE float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

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

/* res[r][t] = <row r, x_t> for an R x NT tile; R*NT*2 independent accumulator chains. */
FORCE_INLINE void ftile(const int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int n,
                        const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    __m256 acc[4][NTMAX][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    int i = 0;
    if (fmt != FMT_FP8 && R == 2 && NT == 4) {
        /* prefill tile: one accumulator per (row, token), half a 16-step at a time, so the
         * 8 accumulators, 4 activation and 2 weight vectors fit the 16 ymm registers */
        __m256 c[2][NTMAX];
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < 4; t++) c[r][t] = _mm256_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            __m256 a0, b0, a1, b1;
            PREFETCH(wr[0] + i * (fmt == FMT_F32 ? 4 : 2));
            PREFETCH(wr[1] + i * (fmt == FMT_F32 ? 4 : 2));
            fdecode16(fmt, wr[0], i, &a0, &b0);
            fdecode16(fmt, wr[1], i, &a1, &b1);
            for (int t = 0; t < 4; t++) {
                __m256 xa = _mm256_loadu_ps((const float *)xp[t] + i);
                c[0][t] = _mm256_fmadd_ps(a0, xa, c[0][t]);
                c[1][t] = _mm256_fmadd_ps(a1, xa, c[1][t]);
            }
            for (int t = 0; t < 4; t++) {
                __m256 xb = _mm256_loadu_ps((const float *)xp[t] + i + 8);
                c[0][t] = _mm256_fmadd_ps(b0, xb, c[0][t]);
                c[1][t] = _mm256_fmadd_ps(b1, xb, c[1][t]);
            }
        }
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < 4; t++) acc[r][t][0] = c[r][t];
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
    const __m256i ones = _mm256_set1_epi16(1);
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
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(x[t], v)), ones);
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
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(x[t], v)), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx[t]), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) res[r][t] = hsum8(acc[r][t]);
}

/* mxfp4: two blocks per 32-byte load; low nibbles of both blocks in one vector, high nibbles in
 * another; int8 dots as in qtile; the 4+4 int32 lanes of a block pair are scaled by
 * [d_b x4 | d_b+1 x4], with d = 2^(s-128) * x_scale computed 8 blocks at a time. */
FORCE_INLINE void mtile(const uint8_t *const *wr, const uint8_t *const *sr, int n,
                        const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
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
                __m256i lo = _mm256_shuffle_epi8(lutu, _mm256_and_si256(q, m4));
                __m256i hi = _mm256_shuffle_epi8(lutu, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
                for (int t = 0; t < NT; t++) {
                    __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[t]), _mm256_maddubs_epi16(hi, xh[t]));
                    __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
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
            __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4));
            __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
            float d0 = E8M0_HALF[sr[r][b]], d1 = E8M0_HALF[sr[r][b + 1]];
            for (int t = 0; t < NT; t++) {
                const float *dx = (const float *)(xp[t] + n) + b;
                __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(alo, _mm256_sign_epi8(xl[t], lo)),
                                               _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(xh[t], hi)));
                __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
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
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(x, v)), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) res[r][t] = hsum8(acc[r][t]);
}

FORCE_INLINE void tile(const int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int n,
                       const uint8_t *const *xp, float (*res)[NTMAX], const int R, const int NT) {
    if (fmt == FMT_MXFP4) mtile(wr, sr, n, xp, res, R, NT);
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
static void dot_row(int fmt, const uint8_t *w, const uint8_t *s, int n, const uint8_t *const *xp, int nt, float *res) {
    switch (fmt) {
    case FMT_F32: dot_float_body(FMT_F32, w, n, xp, res, nt); break;
    case FMT_BF16: dot_float_body(FMT_BF16, w, n, xp, res, nt); break;
    case FMT_F16: dot_float_body(FMT_F16, w, n, xp, res, nt); break;
    case FMT_FP8: dot_fp8_body(w, (const float *)s, n, xp, res, nt); break;
    case FMT_INT8: dot_int8_body(w, (const uint16_t *)s, n, xp, res, nt); break;
    case FMT_MXFP4: dot_mxfp4_body(w, s, n, xp, res, nt); break;
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
        } else if (nt == 4 && F != FMT_FP8 && F != FMT_INT8 && F != FMT_MXFP4) {   \
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

static void dot_tile(int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                     const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {
    switch (fmt) {
    case FMT_F32: dot_tile_FMT_F32(wr, sr, R, n, xp, nt, res); break;
    case FMT_BF16: dot_tile_FMT_BF16(wr, sr, R, n, xp, nt, res); break;
    case FMT_F16: dot_tile_FMT_F16(wr, sr, R, n, xp, nt, res); break;
    case FMT_FP8: dot_tile_FMT_FP8(wr, sr, R, n, xp, nt, res); break;
    case FMT_MXFP4: dot_tile_FMT_MXFP4(wr, sr, R, n, xp, nt, res); break;
    case FMT_INT8: dot_tile_FMT_INT8(wr, sr, R, n, xp, nt, res); break;
    }
}

/* ------------------------------------------------------------------ thread pool */

typedef struct ft_pool ft_pool;
typedef void (*job_fn)(void *arg, int tid);

struct ft_pool {
    int n;
    int active;         /* threads taking part in the current job: n, or 1 for small jobs */
    pthread_t *th;
    _Atomic int gen, done, stop, sleepers;
    job_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int bar_count, bar_gen;
    int64_t spin_ns, small_bytes;
    uint8_t *scratch;
    size_t scratch_cap;
};

typedef struct { ft_pool *p; int tid; int cpu; } worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
static inline int64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void pool_barrier(ft_pool *p) {
    if (p->active == 1) return;
    int g = atomic_load(&p->bar_gen);
    if (atomic_fetch_add(&p->bar_count, 1) == p->n - 1) {
        atomic_store(&p->bar_count, 0);
        atomic_fetch_add(&p->bar_gen, 1);
        return;
    }
    for (unsigned k = 0; atomic_load(&p->bar_gen) == g; k++) {
        if (k < 4096) cpu_relax(); else sched_yield();
    }
}

static void *worker_main(void *a) {
    worker_arg wa = *(worker_arg *)a;
    free(a);
    ft_pool *p = wa.p;
#ifdef __linux__
    if (wa.cpu >= 0) {
        cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(wa.cpu, &cs);
        pthread_setaffinity_np(pthread_self(), sizeof cs, &cs);
    }
#endif
    int seen = 0;
    for (;;) {
        int64_t t0 = 0;
        for (unsigned k = 0; atomic_load(&p->gen) == seen && !atomic_load(&p->stop); k++) {
            /* a few us of pause, then yield: a spinning worker must not hold its core against
             * another runnable thread (torch's OpenMP workers in prefill, other processes) */
            if (k < 2048) cpu_relax(); else sched_yield();
            if ((k & 255) == 255) {
                int64_t t = now_ns();
                if (!t0) t0 = t;
                else if (t - t0 > p->spin_ns) {
                    pthread_mutex_lock(&p->mu);
                    atomic_fetch_add(&p->sleepers, 1);
                    while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
                    atomic_fetch_sub(&p->sleepers, 1);
                    pthread_mutex_unlock(&p->mu);
                    t0 = 0;
                }
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->gen);
        p->fn(p->arg, wa.tid);
        atomic_fetch_add(&p->done, 1);
    }
}

/* Jobs under p->small_bytes of weights/keys run on the calling thread alone: handing them to
 * the workers (a wake-up or a spin hand-off, then a join) costs more than the work. */
static void pool_run_sized(ft_pool *p, job_fn fn, void *arg, int64_t bytes) {
    if (p->n == 1 || bytes < p->small_bytes) { p->active = 1; fn(arg, 0); return; }
    p->active = p->n;
    p->fn = fn; p->arg = arg;
    atomic_store(&p->done, 0);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu); pthread_cond_broadcast(&p->cv); pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0);
    for (unsigned k = 0; atomic_load(&p->done) != p->n - 1; k++) {
        if (k < 4096) cpu_relax(); else sched_yield();
    }
}

static void pool_run(ft_pool *p, job_fn fn, void *arg) { pool_run_sized(p, fn, arg, INT64_MAX); }

/* cpus: n entries (entry 0, the calling thread, is not pinned); NULL = no pinning.
 * small_bytes: jobs that read fewer bytes run on the calling thread alone. */
void *ft_pool_create(int n, const int *cpus, int64_t spin_ns, int64_t small_bytes) {
    pthread_once(&tables_once, init_tables);
    if (n < 1) n = 1;
    ft_pool *p = calloc(1, sizeof *p);
    p->n = n;
    p->spin_ns = spin_ns;
    p->small_bytes = small_bytes;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->th = calloc((size_t)n, sizeof(pthread_t));
    for (int i = 1; i < n; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        wa->p = p; wa->tid = i; wa->cpu = cpus ? cpus[i] : -1;
        pthread_create(&p->th[i], NULL, worker_main, wa);
    }
    return p;
}

void ft_pool_destroy(void *vp) {
    ft_pool *p = vp;
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu); pthread_cond_broadcast(&p->cv); pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    free(p->th); free(p->scratch); free(p);
}

int ft_pool_size(void *vp) { return ((ft_pool *)vp)->n; }

static uint8_t *scratch(ft_pool *p, size_t bytes) {
    if (bytes > p->scratch_cap) {
        free(p->scratch);
        p->scratch_cap = bytes + bytes / 4 + 4096;
        if (posix_memalign((void **)&p->scratch, 64, p->scratch_cap)) { p->scratch = NULL; p->scratch_cap = 0; }
    }
    return p->scratch;
}

/* ------------------------------------------------------------------ the MoE job */

typedef struct {
    const ft_desc *d;
    const void *x; int xt; int64_t T;
    float *out;
    int G;              /* groups (distinct experts) */
    const int64_t *g_e; const int32_t *g_start; const int32_t *g_n;
    const int32_t *r_tok; const float *r_w;   /* per slot, sorted by expert */
    int R;
    uint8_t *xq;        /* T prepared inputs, stride prep_bytes(H) */
    float *hn;          /* R x I natural fp32 */
    uint8_t *hq;        /* R prepared h, stride prep_bytes(I) */
} moe_job;

static inline const uint8_t *scale_row(int fmt, const uint8_t *base, int64_t es, int64_t rs, int64_t e, int r) {
    if (!base) return NULL;
    return base + e * es + (int64_t)(fmt == FMT_FP8 ? r / 128 : r) * rs;
}

static inline void split(int n, int unit, int nth, int tid, int *lo, int *hi) {
    int units = (n + unit - 1) / unit;
    int per = (units + nth - 1) / nth;
    int a = tid * per * unit, b = (tid + 1) * per * unit;
    *lo = a < n ? a : n; *hi = b < n ? b : n;
}

static inline float act_fn(const ft_desc *d, float g, float u) {
    if (d->act == ACT_SILU) return g / (1.f + expf(-g)) * u;
    g = g < d->limit ? g : d->limit;
    u = u < -d->limit ? -d->limit : (u > d->limit ? d->limit : u);
    if (d->act == ACT_SILU_CLAMP) return g / (1.f + expf(-g)) * u;     /* DeepSeek-V4 */
    return (u + 1.f) * (g / (1.f + expf(-g * d->alpha)));
}

typedef struct { moe_job *J; ft_pool *p; } moe_ctx;

static void moe_run_fn(void *a, int tid) {
    moe_ctx *C = a;
    moe_job *J = C->J;
    ft_pool *p = C->p;
    const ft_desc *d = J->d;
    const int H = d->H, I = d->I, fmt = d->fmt, nth = p->active;
    const int64_t xs = prep_bytes(H), hs = prep_bytes(I);

    /* 0. prepare inputs: tokens round-robin */
    float *tmp = J->hn + (int64_t)J->R * I;  /* per-thread row of H floats */
    tmp += (int64_t)tid * H;
    for (int64_t t = tid; t < J->T; t += nth) {
        const float *src;
        if (J->xt == XT_F32) src = (const float *)J->x + t * H;
        else {
            const uint16_t *xb = (const uint16_t *)J->x + t * H;
            for (int k = 0; k < H; k++) tmp[k] = bf16_to_f32(xb[k]);
            src = tmp;
        }
        prep_range(fmt, src, J->xq + t * xs, H, 0, H);
    }
    pool_barrier(p);

    /* 1. gate/up + activation over this thread's j range, all experts */
    int j0, j1;
    split(I, 32, nth, tid, &j0, &j1);
    if (j0 < j1) {
        for (int g = 0; g < J->G; g++) {
            const int64_t e = J->g_e[g];
            const int s0 = J->g_start[g], ns = J->g_n[g];
            const uint8_t *wb = d->gu_w + e * d->gu_w_es;
            const float *gb = d->gu_b ? d->gu_b + e * 2 * I : NULL;
            /* blocks of RB rows stay in L2 while every chunk of tokens passes over them */
            for (int jb = j0; jb < j1; jb += RB)
            for (int c = 0; c < ns; c += NTMAX) {
                int nt = ns - c < NTMAX ? ns - c : NTMAX;
                const int je = jb + RB < j1 ? jb + RB : j1;
                const uint8_t *xp[NTMAX];
                for (int t = 0; t < nt; t++) xp[t] = J->xq + (int64_t)J->r_tok[s0 + c + t] * xs;
                const int jr = nt == 1 ? 2 : 1;   /* rows j..j+jr-1 of gate and of up per tile */
                for (int j = jb; j < je; j += jr) {
                    int m = j + jr <= je ? jr : je - j;
                    const uint8_t *wr[4], *sr[4];
                    float res[4][NTMAX];
                    for (int q = 0; q < m; q++) {
                        wr[q] = wb + (int64_t)(j + q) * d->gu_w_rs;
                        sr[q] = scale_row(fmt, d->gu_s, d->gu_s_es, d->gu_s_rs, e, j + q);
                        wr[m + q] = wb + (int64_t)(I + j + q) * d->gu_w_rs;
                        sr[m + q] = scale_row(fmt, d->gu_s, d->gu_s_es, d->gu_s_rs, e, I + j + q);
                    }
                    tl_pf = (int64_t)m * d->gu_w_rs;
                    dot_tile(fmt, wr, sr, 2 * m, H, xp, nt, res);
                    for (int q = 0; q < m; q++)
                        for (int t = 0; t < nt; t++) {
                            float gg = res[q][t], uu = res[m + q][t];
                            if (gb) { gg += gb[j + q]; uu += gb[I + j + q]; }
                            J->hn[(int64_t)(s0 + c + t) * I + j + q] = act_fn(d, gg, uu);
                        }
                }
            }
        }
        for (int s = 0; s < J->R; s++)
            prep_range(fmt, J->hn + (int64_t)s * I, J->hq + (int64_t)s * hs, I, j0, j1);
    }
    pool_barrier(p);

    /* 2. down over this thread's output rows, all experts */
    int r0, r1;
    split(H, 16, nth, tid, &r0, &r1);
    for (int g = 0; g < J->G && r0 < r1; g++) {
        const int64_t e = J->g_e[g];
        const int s0 = J->g_start[g], ns = J->g_n[g];
        const uint8_t *wb = d->dn_w + e * d->dn_w_es;
        const float *db = d->dn_b ? d->dn_b + e * H : NULL;
        for (int rb = r0; rb < r1; rb += RB)
        for (int c = 0; c < ns; c += NTMAX) {
            int nt = ns - c < NTMAX ? ns - c : NTMAX;
            const int re = rb + RB < r1 ? rb + RB : r1;
            const uint8_t *hp[NTMAX];
            for (int t = 0; t < nt; t++) hp[t] = J->hq + (int64_t)(s0 + c + t) * hs;
            const int rr = nt == 1 ? 4 : 2;
            for (int r = rb; r < re; r += rr) {
                int m = r + rr <= re ? rr : re - r;
                const uint8_t *wr[4], *sr[4];
                float y[4][NTMAX];
                for (int q = 0; q < m; q++) {
                    wr[q] = wb + (int64_t)(r + q) * d->dn_w_rs;
                    sr[q] = scale_row(fmt, d->dn_s, d->dn_s_es, d->dn_s_rs, e, r + q);
                }
                tl_pf = (int64_t)m * d->dn_w_rs;
                dot_tile(fmt, wr, sr, m, I, hp, nt, y);
                for (int q = 0; q < m; q++)
                    for (int t = 0; t < nt; t++) {
                        int s = s0 + c + t;
                        J->out[(int64_t)J->r_tok[s] * H + r + q] += J->r_w[s] * (db ? y[q][t] + db[r + q] : y[q][t]);
                    }
            }
        }
    }
}

typedef struct { int64_t e; int32_t idx; } route_key;
static int cmp_route(const void *a, const void *b) {
    const route_key *x = a, *y = b;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return x->idx - y->idx;
}

/* Returns the number of distinct experts run (>= 0), -1 on a bad expert id, -2 on allocation failure. */
int ft_moe_run(void *vp, const ft_desc *d, const void *x, int xt, int64_t T, int64_t K,
               const int64_t *ids, const float *w, float *out) {
    ft_pool *p = vp;
    const int64_t RK = T * K;
    route_key *keys = malloc(sizeof(route_key) * (size_t)(RK ? RK : 1));
    if (!keys) return -2;
    int R = 0;
    for (int64_t i = 0; i < RK; i++) {
        if (ids[i] < 0) continue;
        if (ids[i] >= d->n_experts) { free(keys); return -1; }
        keys[R].e = ids[i]; keys[R].idx = (int32_t)i; R++;
    }
    if (R == 0) { free(keys); return 0; }
    if (R > 1) qsort(keys, (size_t)R, sizeof *keys, cmp_route);

    const int H = d->H, I = d->I;
    size_t sz_meta = (size_t)R * (8 + 4 + 4 + 4 + 4);
    size_t sz_xq = (size_t)T * (size_t)prep_bytes(H);
    size_t sz_hn = ((size_t)R * I + (size_t)p->n * H) * 4;
    size_t sz_hq = (size_t)R * (size_t)prep_bytes(I);
    size_t a64 = 64;
    #define RUP(v) (((v) + a64 - 1) / a64 * a64)
    uint8_t *buf = scratch(p, RUP(sz_meta) + RUP(sz_xq) + RUP(sz_hn) + RUP(sz_hq));
    if (!buf) { free(keys); return -2; }
    int64_t *g_e = (int64_t *)buf;
    int32_t *g_start = (int32_t *)(g_e + R), *g_n = g_start + R, *r_tok = g_n + R;
    float *r_w = (float *)(r_tok + R);
    uint8_t *xq = buf + RUP(sz_meta);
    float *hn = (float *)(xq + RUP(sz_xq));
    uint8_t *hq = (uint8_t *)hn + RUP(sz_hn);

    int G = 0;
    for (int i = 0; i < R; i++) {
        if (i == 0 || keys[i].e != keys[i - 1].e) { g_e[G] = keys[i].e; g_start[G] = i; g_n[G] = 0; G++; }
        g_n[G - 1]++;
        r_tok[i] = (int32_t)(keys[i].idx / K);
        r_w[i] = w[keys[i].idx];
    }
    free(keys);

    moe_job J = {d, x, xt, T, out, G, g_e, g_start, g_n, r_tok, r_w, R, xq, hn, hq};
    moe_ctx C = {&J, p};
    pool_run_sized(p, moe_run_fn, &C, (int64_t)G * (d->gu_w_es + d->dn_w_es));
    return G;
}

/* ------------------------------------------------------------------ bandwidth probe */

typedef struct { const uint8_t *buf; int64_t n; double *sums; ft_pool *p; } read_job;

static void read_fn(void *a, int tid) {
    read_job *R = a;
    int64_t per = (R->n / R->p->active) & ~(int64_t)255;
    const uint8_t *b = R->buf + per * tid;
    int64_t n = tid == R->p->active - 1 ? R->n - per * tid : per;
    double s = 0;
#ifdef FT_AVX2
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(b + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(b + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(b + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(b + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    s = (double)_mm256_extract_epi64(a0, 0);
#else
    uint64_t acc = 0;
    for (int64_t i = 0; i + 8 <= n; i += 8) { uint64_t v; memcpy(&v, b + i, 8); acc ^= v; }
    s = (double)acc;
#endif
    R->sums[tid] = s;
}

/* Reads n bytes (64-byte aligned buffer) with all pool threads; returns a checksum. */
double ft_read_bytes(void *vp, const void *buf, int64_t n) {
    ft_pool *p = vp;
    double sums[256] = {0};
    read_job R = {buf, n, sums, p};
    pool_run(p, read_fn, &R);
    double s = 0; for (int i = 0; i < p->n && i < 256; i++) s += sums[i];
    return s;
}

/* ------------------------------------------------------------------ dense linear (decode)
 * y[t, r] = <W row r, x[t]> (+ bias[r]) for the few tokens of a decode step: the same dot tiles
 * as the experts, every thread streaming its own disjoint range of output rows. Weights in any
 * format above (dense layers use fp32/bf16/fp16/int8; fp8 scales per 128 rows as in the banks). */

typedef struct {
    int fmt, N, K;
    const uint8_t *w; int64_t w_rs;
    const uint8_t *s; int64_t s_rs;
    const void *x; int xt; int64_t M;
    const float *bias;
    float *y;
    uint8_t *xq; float *tmp;
    ft_pool *p;
} lin_job;

static void lin_fn(void *a, int tid) {
    lin_job *L = a;
    const int fmt = L->fmt, N = L->N, K = L->K, nth = L->p->active;
    const int64_t xs = prep_bytes(K);
    for (int64_t t = tid; t < L->M; t += nth) {   /* prepare the inputs: tokens round-robin */
        const float *src = (const float *)L->x + t * K;
        if (L->xt == XT_BF16) {
            float *tmp = L->tmp + (int64_t)tid * K;
            const uint16_t *xb = (const uint16_t *)L->x + t * K;
            for (int k = 0; k < K; k++) tmp[k] = bf16_to_f32(xb[k]);
            src = tmp;
        }
        prep_range(fmt, src, L->xq + t * xs, K, 0, K);
    }
    pool_barrier(L->p);
    int r0, r1;
    split(N, 16, nth, tid, &r0, &r1);
    for (int rb = r0; rb < r1; rb += RB)
    for (int64_t c = 0; c < L->M; c += NTMAX) {
        const int nt = L->M - c < NTMAX ? (int)(L->M - c) : NTMAX;
        const int re = rb + RB < r1 ? rb + RB : r1;
        const uint8_t *xp[NTMAX];
        for (int t = 0; t < nt; t++) xp[t] = L->xq + (c + t) * xs;
        const int rr = nt == 1 ? 4 : 2;
        for (int r = rb; r < re; r += rr) {
            const int m = r + rr <= re ? rr : re - r;
            const uint8_t *wr[4], *sr[4];
            float res[4][NTMAX];
            for (int q = 0; q < m; q++) {
                wr[q] = L->w + (int64_t)(r + q) * L->w_rs;
                sr[q] = scale_row(fmt, L->s, 0, L->s_rs, 0, r + q);
            }
            tl_pf = (int64_t)m * L->w_rs;
            dot_tile(fmt, wr, sr, m, K, xp, nt, res);
            for (int q = 0; q < m; q++)
                for (int t = 0; t < nt; t++)
                    L->y[(c + t) * N + r + q] = L->bias ? res[q][t] + L->bias[r + q] : res[q][t];
        }
    }
}

/* y [M, N] fp32 = x [M, K] (fp32 or bf16) @ W [N, K]^T + bias. Returns 0, or -2 when the
 * scratch memory cannot be allocated. */
int ft_linear_run(void *vp, int fmt, const void *w, int64_t w_rs, const void *s, int64_t s_rs,
                  int N, int K, const void *x, int xt, int64_t M, const float *bias, float *y) {
    ft_pool *p = vp;
    if (M <= 0) return 0;
    size_t sz_xq = (size_t)M * (size_t)prep_bytes(K), sz_tmp = (size_t)p->n * K * 4;
    uint8_t *buf = scratch(p, (sz_xq + 63) / 64 * 64 + sz_tmp);
    if (!buf) return -2;
    lin_job L = {fmt, N, K, w, w_rs, s, s_rs, x, xt, M, bias, y, buf,
                 (float *)(buf + (sz_xq + 63) / 64 * 64), p};
    pool_run_sized(p, lin_fn, &L, (int64_t)N * w_rs);
    return 0;
}

/* ------------------------------------------------------------------ dequantization (prefill)
 * Rows [0, N) of W in any format -> fp32 [N, K], rows split over the pool: prefill runs big
 * GEMMs in torch, fed from weights that stay in their compact format in memory. */

typedef struct {
    int fmt, N, K;
    const uint8_t *w; int64_t w_rs;
    const uint8_t *s; int64_t s_rs;
    float *out; ft_pool *p;
} deq_job;

static void dequant_row(int fmt, const uint8_t *w, const uint8_t *s, int K, float *o) {
    switch (fmt) {
    case FMT_F32: memcpy(o, w, (size_t)K * 4); break;
    case FMT_BF16: for (int k = 0; k < K; k++) o[k] = float_at(FMT_BF16, w, k); break;
    case FMT_F16: for (int k = 0; k < K; k++) o[k] = float_at(FMT_F16, w, k); break;
    case FMT_FP8:
        for (int b0 = 0; b0 < K; b0 += 128) {
            const float sc = ((const float *)s)[b0 / 128] * TWO_POW_120;
            const int b1 = b0 + 128 < K ? b0 + 128 : K;
            for (int k = b0; k < b1; k++) o[k] = fp8_scaled(w[k]) * sc;
        }
        break;
    case FMT_INT8:
        for (int b = 0; b < K / 32; b++) {
            const float sc = f16_to_f32(((const uint16_t *)s)[b]);
            for (int k = 0; k < 32; k++) o[32 * b + k] = (float)((const int8_t *)w)[32 * b + k] * sc;
        }
        break;
    case FMT_MXFP4: {
        static const float E2M1[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                       -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
        for (int b = 0; b < K / 32; b++) {
            const float sc = 2.f * E8M0_HALF[s[b]];   /* 2^(s-127) */
            for (int k = 0; k < 16; k++) {
                uint8_t v = w[16 * b + k];
                o[32 * b + 2 * k] = E2M1[v & 15] * sc;
                o[32 * b + 2 * k + 1] = E2M1[v >> 4] * sc;
            }
        }
        break;
    }
    }
}

static void deq_fn(void *a, int tid) {
    deq_job *D = a;
    int r0, r1;
    split(D->N, 1, D->p->active, tid, &r0, &r1);
    for (int r = r0; r < r1; r++)
        dequant_row(D->fmt, D->w + (int64_t)r * D->w_rs, scale_row(D->fmt, D->s, 0, D->s_rs, 0, r),
                    D->K, D->out + (int64_t)r * D->K);
}

void ft_dequant_rows(void *vp, int fmt, const void *w, int64_t w_rs, const void *s, int64_t s_rs,
                     int N, int K, float *out) {
    ft_pool *p = vp;
    pthread_once(&tables_once, init_tables);
    deq_job D = {fmt, N, K, w, w_rs, s, s_rs, out, p};
    pool_run_sized(p, deq_fn, &D, (int64_t)N * K * 4);
}

/* ------------------------------------------------------------------ decode attention
 * One new query token per sequence, attending all its keys straight in the paged cache (no
 * gather copy): out[s, h] = softmax_j(scale * <q[s,h], K[slot_sj, h/G]>) . V[slot_sj, h/G].
 * Work items are (sequence, kv head) pairs, so each key row is read once for its G query heads.
 * sinks (gpt-oss): one extra logit per query head in the denominator, its mass dropped. */

typedef struct {
    const float *q; int S, Hq, Hkv, D;
    const uint8_t *k, *v; int kvt;          /* XT_F32 or XT_BF16 */
    const int64_t *slots; int64_t kmax; const int64_t *nkeys;
    float scale; const float *sinks;
    float *out; float *scores; int64_t sc_stride;
    ft_pool *p;
} att_job;

#ifdef FT_AVX2
FORCE_INLINE __m256 kv_load8(const uint8_t *row, int kvt, int i) {
    if (kvt == XT_F32) return _mm256_loadu_ps((const float *)row + i);
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
}

/* exp(x) for 8 lanes (Cephes expf: range reduction by ln2, degree-5 polynomial; ~1 ulp);
 * inputs <= 0 here (scores minus their max), so only the lower clamp matters. */
FORCE_INLINE __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654475f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

/* sc[j] = scale * <q, K[slot_j]> for j < n: four keys at a time share each q load and one
 * horizontal reduction. */
FORCE_INLINE void att_scores(const float *q, const uint8_t *kb, int64_t row_bytes, int64_t head_off, const int kvt,
                       const int64_t *slots, int64_t n, int D, float scale, float *sc) {
    int64_t j = 0;
#ifdef FT_AVX2
    if (D % 8 == 0) {
        for (; j + 4 <= n; j += 4) {
            const uint8_t *r[4];
            for (int t = 0; t < 4; t++) r[t] = kb + slots[j + t] * row_bytes + head_off;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < D; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                a0 = _mm256_fmadd_ps(qv, kv_load8(r[0], kvt, i), a0);
                a1 = _mm256_fmadd_ps(qv, kv_load8(r[1], kvt, i), a1);
                a2 = _mm256_fmadd_ps(qv, kv_load8(r[2], kvt, i), a2);
                a3 = _mm256_fmadd_ps(qv, kv_load8(r[3], kvt, i), a3);
            }
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(sc + j, _mm_mul_ps(s4, _mm_set1_ps(scale)));
        }
    }
#endif
    for (; j < n; j++) {
        const uint8_t *r = kb + slots[j] * row_bytes + head_off;
        float acc = 0.f;
        for (int i = 0; i < D; i++) acc += q[i] * float_at(kvt, r, i);
        sc[j] = acc * scale;
    }
}

/* p[j] = exp(p[j] - m) in place; returns their sum. */
static float att_exp(float *p, int64_t n, float m) {
    int64_t j = 0;
    float sum = 0.f;
#ifdef FT_AVX2
    __m256 acc = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), mv));
        _mm256_storeu_ps(p + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum8(acc);
#endif
    for (; j < n; j++) { p[j] = expf(p[j] - m); sum += p[j]; }
    return sum;
}

/* o += sum_j w[j] * V[slot_j] with o held in registers: 64 columns at a time (8 accumulators,
 * a constant count so they stay in registers), then 8 at a time. */
FORCE_INLINE void att_values(const float *w, const uint8_t *vb, int64_t row_bytes, int64_t head_off, const int kvt,
                             const int64_t *slots, int64_t n, int D, float *o) {
    int c0 = 0;
#ifdef FT_AVX2
    for (; c0 + 64 <= D; c0 += 64) {
        __m256 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm256_loadu_ps(o + c0 + 8 * u);
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *r = vb + slots[j] * row_bytes + head_off;
            const __m256 wj = _mm256_set1_ps(w[j]);
            for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(wj, kv_load8(r, kvt, c0 + 8 * u), acc[u]);
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(o + c0 + 8 * u, acc[u]);
    }
    for (; c0 + 8 <= D; c0 += 8) {
        __m256 acc = _mm256_loadu_ps(o + c0);
        for (int64_t j = 0; j < n; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), kv_load8(vb + slots[j] * row_bytes + head_off, kvt, c0), acc);
        _mm256_storeu_ps(o + c0, acc);
    }
#endif
    for (int c = c0; c < D; c++) {
        float acc = o[c];
        for (int64_t j = 0; j < n; j++) acc += w[j] * float_at(kvt, vb + slots[j] * row_bytes + head_off, c);
        o[c] = acc;
    }
}

/* One (sequence, kv head) item. Keys and values are taken in blocks of ATT_BLOCK rows that
 * serve all G query heads while they sit in L1: the item's K/V (hundreds of KB at long
 * contexts, rows 2 KB apart in the paged layout) would not stay in a 512 KB L2 across G passes.
 * sc holds the G x n scores. */
#define ATT_BLOCK 32
FORCE_INLINE void att_item(const att_job *A, int s, int h, float *sc, const int kvt) {
    const int G = A->Hq / A->Hkv, D = A->D;
    const int64_t es = kvt == XT_F32 ? 4 : 2, row_bytes = (int64_t)A->Hkv * D * es;
    const int64_t n = A->nkeys[s], head_off = (int64_t)h * D * es;
    const int64_t *slots = A->slots + (int64_t)s * A->kmax;
    const float *q = A->q + ((int64_t)s * A->Hq + (int64_t)h * G) * D;
    float *o = A->out + ((int64_t)s * A->Hq + (int64_t)h * G) * D;
    for (int64_t j0 = 0; j0 < n; j0 += ATT_BLOCK) {
        const int64_t nb = n - j0 < ATT_BLOCK ? n - j0 : ATT_BLOCK;
        for (int g = 0; g < G; g++)
            att_scores(q + (int64_t)g * D, A->k, row_bytes, head_off, kvt, slots + j0, nb, D, A->scale, sc + g * n + j0);
    }
    for (int g = 0; g < G; g++) {
        float *r = sc + g * n;
        const int hq = h * G + g;
        float m = A->sinks ? A->sinks[hq] : -INFINITY;
        for (int64_t j = 0; j < n; j++) m = r[j] > m ? r[j] : m;
        float sum = att_exp(r, n, m);
        if (A->sinks) sum += expf(A->sinks[hq] - m);
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < n; j++) r[j] *= inv;
    }
    memset(o, 0, (size_t)G * D * 4);
    for (int64_t j0 = 0; j0 < n; j0 += ATT_BLOCK) {
        const int64_t nb = n - j0 < ATT_BLOCK ? n - j0 : ATT_BLOCK;
        for (int g = 0; g < G; g++)
            att_values(sc + g * n + j0, A->v, row_bytes, head_off, kvt, slots + j0, nb, D, o + (int64_t)g * D);
    }
}

static void att_fn(void *a, int tid) {
    att_job *A = a;
    float *sc = A->scores + (int64_t)tid * A->sc_stride;
    for (int item = tid; item < A->S * A->Hkv; item += A->p->active) {
        if (A->kvt == XT_F32) att_item(A, item / A->Hkv, item % A->Hkv, sc, XT_F32);
        else att_item(A, item / A->Hkv, item % A->Hkv, sc, XT_BF16);
    }
}

/* q fp32 [S, Hq, D]; k/v caches [slots, Hkv, D] (fp32 or bf16); slots int64 [S, kmax] with
 * nkeys[s] valid entries; sinks fp32 [Hq] or NULL; out fp32 [S, Hq, D]. 0, or -2 (memory). */
int ft_decode_attention(void *vp, const float *q, int S, int Hq, int Hkv, int D, const void *k, const void *v,
                        int kvt, const int64_t *slots, int64_t kmax, const int64_t *nkeys, float scale,
                        const float *sinks, float *out) {
    ft_pool *p = vp;
    const int64_t stride = (kmax * (Hq / Hkv) + 15) & ~(int64_t)15;
    float *sc = (float *)scratch(p, (size_t)stride * p->n * 4);
    if (!sc) return -2;
    att_job A = {q, S, Hq, Hkv, D, k, v, kvt, slots, kmax, nkeys, scale, sinks, out, sc, stride, p};
    int64_t kv_bytes = 0;
    for (int s = 0; s < S; s++) kv_bytes += nkeys[s];
    pool_run_sized(p, att_fn, &A, kv_bytes * 2 * Hkv * D * (kvt == XT_F32 ? 4 : 2));
    return 0;
}

/* ------------------------------------------------------------------ RMSNorm rows
 * out[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)) for fp32 rows of length n, in the calling thread
 * (decode rows are a few KB: a thread hand-off would cost more than the work). */
void ft_rms_norm(const float *x, const float *w, int64_t rows, int n, float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        float ss = 0.f;
        int i = 0;
#ifdef FT_AVX2
        __m256 a = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) { __m256 v = _mm256_loadu_ps(xr + i); a = _mm256_fmadd_ps(v, v, a); }
        ss = hsum8(a);
#endif
        for (; i < n; i++) ss += xr[i] * xr[i];
        const float inv = 1.f / sqrtf(ss / (float)n + eps);
        for (i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* ------------------------------------------------------------------ rotary embedding (NeoX halves)
 * out[t, h, i] = x*cos + rotate_half(x)*sin over the first `rot` of D columns (rest copied),
 * cos/sin rows [T, rot]; in the calling thread (a decode step's q/k are a few KB). */
void ft_rope(const float *x, const float *cos, const float *sin, int64_t T, int H, int D, int rot, float *out) {
    const int half = rot / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * rot, *s = sin + t * rot;
        for (int h = 0; h < H; h++) {
            const float *xr = x + (t * H + h) * D;
            float *o = out + (t * H + h) * D;
            for (int i = 0; i < half; i++) o[i] = xr[i] * c[i] - xr[i + half] * s[i];
            for (int i = half; i < rot; i++) o[i] = xr[i] * c[i] + xr[i - half] * s[i];
            for (int i = rot; i < D; i++) o[i] = xr[i];
        }
    }
}
