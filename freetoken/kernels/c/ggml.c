/* llama.cpp's block quantizations (FMT_GGML banks): dot products of raw GGUF rows with
 * activations quantized per 32 (int8 + fp32 scale, like llama.cpp's Q8_0 activations).
 *
 * A row's type comes per expert tensor (the bank's int32 type arrays); every type is reduced to
 * the same step: 32 weights as unsigned codes (Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 offset +12, Q2_K,
 * Q3_K (+4), Q4_K, Q5_K, Q6_K, TQ1_0/TQ2_0 (+1)) or signed bytes (Q8_0, IQ4_NL's values), an
 * integer dot with the 32 int8 activations (vpdpbusd on AVX512-VNNI, else maddubs+madd), one fma
 * with weight scale x activation scale; the offsets of the unsigned codes (Q4_0's 8, Q5_0's 16,
 * MXFP4's 12, Q4_1/Q5_1's and the k-quants' mins, Q3_K's 4, Q6_K's 32, the ternary types' 1) are
 * removed once per 32 (per 16 for Q2_K, Q3_K, Q6_K, whose scales are per 16) with the
 * activation block sums from prep. Types and layouts: quant/ggml_quants.py. Under ft_ggml_k256 the
 * k-quant rows read per-256 activations instead (krow: llama.cpp's Q8_K arithmetic, ggml_act.c). */
#include "ft_kernels.h"

/* per-type properties the kernels branch on (compile-time constants inside grow) */
#define G_SIGNED(t) ((t) == GT_Q8_0 || (t) == GT_IQ4_NL)              /* signed codes, no offset */
#define G_PER16(t) ((t) == GT_Q6_K || (t) == GT_Q2_K || (t) == GT_Q3_K) /* scales per 16 weights */
/* Q4_K / Q5_K rows at most this wide take krow's k4scales (AVX-512): see krow */
#define K4_MAX_WIDTH 1024

/* Prepared activations: int8 q[n] (natural order) | float d[n/32] | float s32[n/32] |
 * float s16[n/16] | float sm[n/32], where s32 / s16 = d * the sum of the block's 32 / the
 * group's 16 q (the offset corrections) and sm the block sums the mins of Q4_1 / Q5_1 multiply:
 * s32, or under llama.cpp's rounding (ggml_act.c) q8_1's fp16 s. 1.75 n bytes of prep_bytes'. */
void ggml_prep(const float *src, uint8_t *dst, int n, int j0, int j1) {
    int8_t *q = (int8_t *)dst;
    float *d = (float *)(dst + n), *s32 = d + n / 32, *s16 = s32 + n / 32, *sm = s16 + n / 16;
    for (int b = j0 / 32; b < j1 / 32; b++) {
        const float *x = src + b * 32;
        float amax = 0.f;
        for (int i = 0; i < 32; i++) { float a = fabsf(x[i]); amax = a > amax ? a : amax; }
        float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
        if (ft_ggml_act_llama) id = amax > 0.f ? 127.f / amax : 0.f;   /* ggml-cpu x86 quantize_row_q8_0/q8_1's 1/d */
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 32; i++) {
            int v = (int)nearbyintf(x[i] * id);
            q[b * 32 + i] = (int8_t)v;
            if (i < 16) s0 += v; else s1 += v;
        }
        d[b] = dd; s32[b] = sm[b] = (float)(s0 + s1) * dd; s16[2 * b] = (float)s0 * dd; s16[2 * b + 1] = (float)s1 * dd;
        if (ft_ggml_act_llama) {   /* ggml_act.c: q8_0/q8_1's fp16 d and s (s of the unrounded d) */
            d[b] = ggml_round_f16(dd); sm[b] = ggml_round_f16(sm[b]);
            s32[b] = (float)(s0 + s1) * d[b]; s16[2 * b] = (float)s0 * d[b]; s16[2 * b + 1] = (float)s1 * d[b];
        }
    }
}

static inline float e8m0_half(uint8_t e) {   /* 2^(e-128), ggml_e8m0_to_fp32_half */
    uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23; float f; memcpy(&f, &u, 4); return f;
}
typedef struct { const int8_t *q; const float *d, *s32, *s16, *sm; } xview;
static inline xview xv(const uint8_t *p, int n) {
    const float *d = (const float *)(p + n);
    xview v = {(const int8_t *)p, d, d + n / 32, d + n / 16, d + n / 16 + n / 16};
    return v;
}

typedef struct { const int8_t *q; const float *d; const int16_t *bs; } kview;   /* ggml_prep256's part */
static inline kview kv(const uint8_t *p, int n) {
    const int8_t *q = (const int8_t *)(p + K256_AT(n));
    const float *d = (const float *)(q + n);
    kview v = {q, d, (const int16_t *)(d + n / 256)};
    return v;
}

#ifdef FT_AVX2

/* Q3_K's 16 6-bit scales of a super-block (4 low bits at 96..103, 2 high bits at 104..107) as
 * signed bytes sc - 32: shared by the per-32 and the per-256 (krow) paths */
static inline __m128i q3k_scales(const uint8_t *blk) {
    uint32_t l0, l1, hh;
    memcpy(&l0, blk + 96, 4); memcpy(&l1, blk + 100, 4); memcpy(&hh, blk + 104, 4);
    const uint32_t n4 = 0x0f0f0f0fu, n2 = 0x03030303u;
    return _mm_sub_epi8(_mm_setr_epi32((int)((l0 & n4) | (hh & n2) << 4), (int)((l1 & n4) | ((hh >> 2) & n2) << 4),
                                       (int)(((l0 >> 4) & n4) | ((hh >> 4) & n2) << 4),
                                       (int)(((l1 >> 4) & n4) | ((hh >> 6) & n2) << 4)),
                        _mm_set1_epi8(32));
}

/* 8 blocks of 32 weights at a time (one k-quant super-block, or 8 legacy blocks): the weight
 * scales ws[8] and offset coefficients os[8] (of the block sums) become vectors, so per token the
 * float work is one mul (D = ws * dx) and one fma (offsets) per 8 blocks, and per block one
 * integer dot, a convert and an fma with lane k of D. Q6_K has a scale per 16: ws16/os16. */
FORCE_INLINE __m256 f16x8(const uint8_t *p, int stride) {   /* 8 fp16 scales `stride` bytes apart */
    __m128i v = _mm_setzero_si128();
    v = _mm_insert_epi16(v, *(const uint16_t *)(p), 0);
    v = _mm_insert_epi16(v, *(const uint16_t *)(p + stride), 1);
    v = _mm_insert_epi16(v, *(const uint16_t *)(p + 2 * stride), 2);
    v = _mm_insert_epi16(v, *(const uint16_t *)(p + 3 * stride), 3);
    v = _mm_insert_epi16(v, *(const uint16_t *)(p + 4 * stride), 4);
    v = _mm_insert_epi16(v, *(const uint16_t *)(p + 5 * stride), 5);
    v = _mm_insert_epi16(v, *(const uint16_t *)(p + 6 * stride), 6);
    v = _mm_insert_epi16(v, *(const uint16_t *)(p + 7 * stride), 7);
    return _mm256_cvtph_ps(v);
}

/* 32 bytes whose byte i is 0x10 where bit i of the little-endian u32 at p is set (Q5_0/Q5_1) */
FORCE_INLINE __m256i hbits32(const uint8_t *p) {
    uint32_t h; memcpy(&h, p, 4);
    const __m256i sh = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sh), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* The 32 codes of one legacy block (blocks of 32 with the scale d first) at q: unsigned, except
 * Q8_0's and IQ4_NL's signed values. */
FORCE_INLINE __m256i decode32(const int type, const uint8_t *q) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (type == GT_Q8_0) return _mm256_loadu_si256((const __m256i *)(q + 2));
    const int at = type == GT_MXFP4 ? 1 : type == GT_Q4_0 || type == GT_IQ4_NL ? 2 : type == GT_Q4_1 ? 4
                 : type == GT_Q5_0 ? 6 : 8;
    __m128i v = _mm_loadu_si128((const __m128i *)(q + at));
    __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
    if (type == GT_MXFP4) {
        const __m256i lutu = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                              12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        return _mm256_shuffle_epi8(lutu, nib);
    }
    if (type == GT_IQ4_NL) {
        const __m256i lut = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                             -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        return _mm256_shuffle_epi8(lut, nib);
    }
    if (type == GT_Q5_0 || type == GT_Q5_1) nib = _mm256_or_si256(nib, hbits32(q + (type == GT_Q5_0 ? 2 : 4)));
    return nib;
}

/* Offset coefficient of a legacy block per unit of weight scale d (x = d (code - off)); Q4_1 and
 * Q5_1 carry their own min m instead (x = d code + m: coefficient -m). */
#define G_OFF(t) ((t) == GT_Q4_0 ? 8.f : (t) == GT_Q5_0 ? 16.f : (t) == GT_MXFP4 ? 12.f : 0.f)
#define G_MIN(t) ((t) == GT_Q4_1 || (t) == GT_Q5_1)

/* TQ1_0's trit at the top of each byte: (b * 3) >> 8 = [b >= 86] + [b >= 171] */
FORCE_INLINE __m256i trit(__m256i b) {
    const __m256i c1 = _mm256_set1_epi8((char)86), c2 = _mm256_set1_epi8((char)171);
    __m256i a = _mm256_cmpeq_epi8(_mm256_max_epu8(b, c1), b), c = _mm256_cmpeq_epi8(_mm256_max_epu8(b, c2), b);
    return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(a, c));
}
FORCE_INLINE __m256i times3(__m256i b) { return _mm256_add_epi8(b, _mm256_add_epi8(b, b)); }   /* mod 256 */

/* Decodes 8 blocks of 32: wv[k] the 32 weight codes of block k, ws/os the weight scales and
 * offset coefficients as vectors (per-16 types: ws[0..1], os[0..1] per 16 weights), built in
 * registers (8 scalar stores reloaded as one vector would stall store forwarding). */
FORCE_INLINE void decode8(const int type, const uint8_t *blk, __m256i *wv, __m256 *ws, __m256 *os) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3);
    if (ggml_blocks32(type)) {
        const int bs = ggml_bytes256(type) / 8;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) wv[k] = decode32(type, blk + bs * k);
        if (type == GT_MXFP4) {   /* 2^(e-128): bits (e-1)<<23, or 0x00200000<<e below e = 2 */
            __m128i e8 = _mm_setzero_si128();
            for (int k = 0; k < 8; k++) e8 = _mm_insert_epi16(e8, blk[17 * k], k);
            __m256i e = _mm256_cvtepu16_epi32(e8), two = _mm256_set1_epi32(2);
            __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
            ws[0] = _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, _mm256_cmpgt_epi32(two, e)));
        } else {
            ws[0] = f16x8(blk, bs);
        }
        os[0] = G_MIN(type) ? _mm256_sub_ps(_mm256_setzero_ps(), f16x8(blk + 2, bs))
                            : _mm256_mul_ps(ws[0], _mm256_set1_ps(G_OFF(type)));   /* unused when signed */
    } else if (type == GT_Q4_K || type == GT_Q5_K) {
        const int q5 = type == GT_Q5_K;
        const uint8_t *qs = blk + (q5 ? 48 : 16);
        uint32_t a, b, c;
        memcpy(&a, blk + 4, 4); memcpy(&b, blk + 8, 4); memcpy(&c, blk + 12, 4);
        const uint64_t sc = (a & 0x3f3f3f3fu) | (uint64_t)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)) << 32;
        const uint64_t mn = (b & 0x3f3f3f3fu) | (uint64_t)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)) << 32;
        ws[0] = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)blk)),
                              _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)sc))));
        os[0] = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 2))),
                              _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)mn))));
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c4 = 0; c4 < 4; c4++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c4));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c4), m1), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c4 + 1), m1), 4));
            }
            wv[2 * c4] = lo; wv[2 * c4 + 1] = hi;
        }
    } else if (type == GT_Q6_K) {   /* scales per 16 weights */
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 208)));
        __m128i s16 = _mm_loadu_si128((const __m128i *)(blk + 192));
        ws[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16)));
        ws[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(s16, s16))));
        os[0] = _mm256_mul_ps(ws[0], _mm256_set1_ps(32.f));
        os[1] = _mm256_mul_ps(ws[1], _mm256_set1_ps(32.f));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
            __m256i qv[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                             _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++)
                wv[4 * h + s] = _mm256_or_si256(qv[s], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m3), 4));
        }
    } else if (type == GT_Q2_K || type == GT_Q3_K || type == GT_TQ2_0) {
        /* 2-bit codes: block 4h + j = bits 2j of the 32 bytes qs[32 h ..] */
        const uint8_t *qs = blk + (type == GT_Q2_K ? 16 : type == GT_Q3_K ? 32 : 0);
        if (type == GT_Q2_K) {   /* x = d (sc & 15) q - dmin (sc >> 4), per 16 */
            const __m128i s = _mm_loadu_si128((const __m128i *)blk), n4 = _mm_set1_epi8(0x0f);
            const __m128i sl = _mm_and_si128(s, n4), sh = _mm_and_si128(_mm_srli_epi16(s, 4), n4);
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 80)));
            const __m256 dm = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 82)));
            ws[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sl)));
            ws[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sl, 8))));
            os[0] = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sh)));
            os[1] = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sh, 8))));
        } else if (type == GT_Q3_K) {   /* x = d (sc - 32) (q + 4 hbit - 4), 6-bit sc per 16 */
            const __m128i s = q3k_scales(blk);
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 108)));
            ws[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)));
            ws[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))));
            os[0] = _mm256_mul_ps(ws[0], _mm256_set1_ps(4.f));
            os[1] = _mm256_mul_ps(ws[1], _mm256_set1_ps(4.f));
        } else {   /* TQ2_0: x = d (q - 1) */
            ws[0] = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 64)));
            os[0] = ws[0];
        }
        const __m256i hm = type == GT_Q3_K ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                if (type == GT_Q3_K)   /* bit 4h + j of hmask[i]: the code's bit 2 */
                    c = _mm256_or_si256(c, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), m1), 2));
                wv[4 * h + j] = c;
            }
        }
    } else {   /* GT_TQ1_0: x = d (trit - 1); trit p of byte b is the top trit of b 3^p (mod 256) */
        ws[0] = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 52)));
        os[0] = ws[0];
        __m256i v = _mm256_loadu_si256((const __m256i *)blk);      /* elements 32 p + i, p < 5 */
#pragma GCC unroll 5
        for (int k = 0; k < 5; k++) { wv[k] = trit(v); v = times3(v); }
        /* elements 160 + 16 p + i (p < 5, i < 16) from qs[32 + i]; 240 + 4 p + i from qh[i] */
        const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 32)));
        const __m256i b5 = _mm256_blend_epi32(a, times3(a), 0xF0);            /* [x1 | x3] */
        const __m256i b6 = times3(times3(b5));                                  /* [x9 | x27] */
        uint32_t qh; memcpy(&qh, blk + 48, 4);
        const __m128i h1 = _mm_set1_epi32((int)qh);
        const __m128i h3 = _mm_add_epi8(h1, _mm_add_epi8(h1, h1)), h9 = _mm_add_epi8(h3, _mm_add_epi8(h3, h3));
        const __m128i h27 = _mm_add_epi8(h9, _mm_add_epi8(h9, h9));
        const __m128i hv = _mm_blend_epi32(_mm_blend_epi32(h1, h3, 0x2), _mm_blend_epi32(h9, h27, 0x8), 0xC);
        const __m256i b7 = _mm256_inserti128_si256(times3(times3(b6)), hv, 1);   /* [x81 | qh] */
        wv[5] = trit(b5); wv[6] = trit(b6); wv[7] = trit(b7);
    }
}

FORCE_INLINE void grow(const int type, const uint8_t *w, int n, const xview *X, float *res, const int NT) {
    const int k6 = G_PER16(type), sg = G_SIGNED(type);
    const int bs = ggml_bytes256(type);
    const __m256i lo4 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), hi4 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    __m256 acc[NTMAX][2], corr[NTMAX];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = corr[t] = _mm256_setzero_ps();
#ifdef FT_AVX512
    __m512 acc2[NTMAX];
    for (int t = 0; t < NT; t++) acc2[t] = _mm512_setzero_ps();
    /* Q4_K: one token's pair codes straight from the 32 bytes they share (low nibbles | high
     * nibbles), so one token takes the 512-bit loop too, with no insert per pair (its lanes sum
     * the blocks in the 256-bit loop's order: the same result, bit for bit; 2-4 tokens as before) */
    const int w512 = NT >= 2 || type == GT_Q4_K;
    const __m512i q4sh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    /* Q4_K under vpdpbusd (int32 sums: no int16 pairs to saturate): an odd block's codes left in
     * the high nibble (16 q, a mask instead of a shift per pair) and its scale taken / 16, exact
     * (a power of two): the same products, bit for bit */
#ifdef FT_VNNI
    const int q4x16 = type == GT_Q4_K;
#else
    const int q4x16 = 0;
#endif
    const __m512i q4hi = _mm512_inserti64x4(_mm512_set1_epi8(0x0f), _mm256_set1_epi8((char)0xf0), 1);
    const __m256 odd16 = _mm256_setr_ps(1.f, 0.0625f, 1.f, 0.0625f, 1.f, 0.0625f, 1.f, 0.0625f);
#endif
    for (int g8 = 0; g8 < n / 256; g8++) {
        const uint8_t *blk = w + (int64_t)bs * g8;
        for (int o = 0; o < bs; o += 64) PREFETCH(blk + o);
        __m256i wv[8];
        __m256 ws[2], os[2];
        decode8(type, blk, wv, ws, os);
        const int b0 = 8 * g8;
        __m256 D[NTMAX][2];
        for (int t = 0; t < NT; t++) {
            __m256 dx = _mm256_loadu_ps(X[t].d + b0);
            if (k6) {   /* per 16: lanes [g0 g0 g1 g1 ...] of dx, scales per group */
                __m256 dlo = _mm256_permutevar8x32_ps(dx, lo4), dhi = _mm256_permutevar8x32_ps(dx, hi4);
                D[t][0] = _mm256_mul_ps(ws[0], dlo);
                D[t][1] = _mm256_mul_ps(ws[1], dhi);
                corr[t] = _mm256_fmadd_ps(os[0], _mm256_loadu_ps(X[t].s16 + 2 * b0), corr[t]);
                corr[t] = _mm256_fmadd_ps(os[1], _mm256_loadu_ps(X[t].s16 + 2 * b0 + 8), corr[t]);
            } else {
                D[t][0] = _mm256_mul_ps(ws[0], dx);
#ifdef FT_AVX512
                if (q4x16) D[t][0] = _mm256_mul_ps(D[t][0], odd16);
#endif
                if (!sg)
                    corr[t] = _mm256_fmadd_ps(os[0], _mm256_loadu_ps((G_MIN(type) ? X[t].sm : X[t].s32) + b0), corr[t]);
            }
        }
#ifdef FT_AVX512
        /* 2-4 tokens (and Q4_K's one): two blocks per 512-bit dot, half the dot/convert/fma
         * instructions of the loop below (measured 10-35% faster there; for one token of the
         * other types, whose pairs need an insert, the 256-bit loop is as fast) */
        if (w512) {
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            const __m512i qb = type == GT_Q4_K ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 16 * k)))
                                                : _mm512_setzero_si512();
            __m512i w2 = q4x16 ? _mm512_and_si512(qb, q4hi)
                : type == GT_Q4_K && NT == 1 ? _mm512_and_si512(_mm512_srlv_epi16(qb, q4sh), _mm512_set1_epi8(0x0f))
                : _mm512_inserti64x4(_mm512_castsi256_si512(wv[k]), wv[k + 1], 1);
            __m512i u = sg ? _mm512_abs_epi8(w2) : w2;
            const int j = k & 3;   /* per 16: the pair's 4 scales of 16 (lanes 2j .. 2j + 3 of D) */
            const __m512i sel = k6 ? _mm512_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                      2 * j + 2, 2 * j + 2, 2 * j + 2, 2 * j + 2, 2 * j + 3, 2 * j + 3, 2 * j + 3, 2 * j + 3)
                                   : _mm512_setr_epi32(k, k, k, k, k, k, k, k, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1);
            for (int t = 0; t < NT; t++) {
                __m512i xq = _mm512_loadu_si512((const void *)(X[t].q + 32 * (b0 + k)));
                if (sg) xq = _mm512_mask_sub_epi8(xq, _mm512_movepi8_mask(w2), _mm512_setzero_si512(), xq);
                __m512 sc = _mm512_permutexvar_ps(sel, _mm512_castps256_ps512(D[t][k6 ? k >> 2 : 0]));
                acc2[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot512_u8s8(u, xq)), sc, acc2[t]);
            }
        }
        } else
#endif
        {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i u = sg ? _mm256_abs_epi8(wv[k]) : wv[k];
            const __m256i sel = k6 ? _mm256_setr_epi32(2 * (k & 3), 2 * (k & 3), 2 * (k & 3), 2 * (k & 3),
                                                       2 * (k & 3) + 1, 2 * (k & 3) + 1, 2 * (k & 3) + 1, 2 * (k & 3) + 1)
                                   : _mm256_set1_epi32(k);
            for (int t = 0; t < NT; t++) {
                __m256i xq = _mm256_loadu_si256((const __m256i *)(X[t].q + 32 * (b0 + k)));
                if (sg) xq = _mm256_sign_epi8(xq, wv[k]);
                __m256 sc = _mm256_permutevar8x32_ps(D[t][k6 ? k >> 2 : 0], sel);
                acc[t][k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(u, xq)), sc, acc[t][k & 1]);
            }
        }
        }
    }
#ifdef FT_AVX512
    for (int t = 0; t < NT && w512; t++)
        acc[t][0] = _mm256_add_ps(_mm512_castps512_ps256(acc2[t]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc2[t]), 1)));
#endif
    for (int t = 0; t < NT; t++) res[t] = hsum8(_mm256_sub_ps(_mm256_add_ps(acc[t][0], acc[t][1]), corr[t]));
    /* legacy types: rows need not be a multiple of 256; the last < 8 blocks one at a time */
    const int nb = n / 32, bs1 = bs / 8;
    for (int b = n / 256 * 8; b < nb; b++) {
        const uint8_t *q = w + (int64_t)bs1 * b;
        const __m256i wv = decode32(type, q);
        const float dw = type == GT_MXFP4 ? e8m0_half(q[0]) : _cvtsh_ss(*(const uint16_t *)q);
        const float oc = G_MIN(type) ? -_cvtsh_ss(*(const uint16_t *)(q + 2)) : dw * G_OFF(type);
        for (int t = 0; t < NT; t++) {
            __m256i xq = _mm256_loadu_si256((const __m256i *)(X[t].q + 32 * b));
            __m256i p = sg ? dot_u8s8(_mm256_abs_epi8(wv), _mm256_sign_epi8(xq, wv)) : dot_u8s8(wv, xq);
            res[t] += dw * (hsum8(_mm256_cvtepi32_ps(p)) * X[t].d[b]) - oc * (G_MIN(type) ? X[t].sm : X[t].s32)[b];
        }
    }
}

/* Per-256 activations (ggml_act.c's ggml_prep256, llama.cpp's Q8_K): a k-quant super-block's
 * integer sub-scales per 16 weights (sc; per-32 types twice) and offset coefficients per 16 (oc),
 * and their fp16 factors d, dm: the row's dot is, per super-block, dx (d sum_g sc_g P_g - dm
 * sum_g oc_g S_g), P_g the integer dot of group g's codes with x, S_g the sum of x over it. */
FORCE_INLINE void kscales(const int type, const uint8_t *blk, __m256i *sc, __m256i *oc, float *d, float *dm) {
    if (type == GT_Q4_K || type == GT_Q5_K) {   /* x = d sc q - dmin m, 6-bit sc and m per 32 */
        uint32_t a, b, c;
        memcpy(&a, blk + 4, 4); memcpy(&b, blk + 8, 4); memcpy(&c, blk + 12, 4);
        const uint64_t s = (a & 0x3f3f3f3fu) | (uint64_t)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)) << 32;
        const uint64_t m = (b & 0x3f3f3f3fu) | (uint64_t)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)) << 32;
        const __m128i s8 = _mm_cvtsi64_si128((int64_t)s), m8 = _mm_cvtsi64_si128((int64_t)m);
        *sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s8, s8));
        *oc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        *d = _cvtsh_ss(*(const uint16_t *)blk);
        *dm = _cvtsh_ss(*(const uint16_t *)(blk + 2));
    } else if (type == GT_Q6_K) {               /* x = d sc (q - 32), int8 sc per 16 */
        *sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        *oc = _mm256_slli_epi16(*sc, 5);
        *d = *dm = _cvtsh_ss(*(const uint16_t *)(blk + 208));
    } else if (type == GT_Q3_K) {               /* x = d (sc - 32) (q - 4), q with its high bit */
        const __m128i s = q3k_scales(blk);
        *sc = _mm256_cvtepi8_epi16(s);
        *oc = _mm256_slli_epi16(*sc, 2);
        *d = *dm = _cvtsh_ss(*(const uint16_t *)(blk + 108));
    } else {                                    /* Q2_K: x = d (s & 15) q - dmin (s >> 4), per 16 */
        const __m128i s = _mm_loadu_si128((const __m128i *)blk), n4 = _mm_set1_epi8(0x0f);
        *sc = _mm256_cvtepu8_epi16(_mm_and_si128(s, n4));
        *oc = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), n4));
        *d = _cvtsh_ss(*(const uint16_t *)(blk + 80));
        *dm = _cvtsh_ss(*(const uint16_t *)(blk + 82));
    }
}

/* Q4_K / Q5_K: the fp16 factors d, dmin alone (their sub-scales from k4scales) */
FORCE_INLINE void kd_dm(const uint8_t *blk, float *d, float *dm) {
    *d = _cvtsh_ss(*(const uint16_t *)blk);
    *dm = _cvtsh_ss(*(const uint16_t *)(blk + 2));
}

/* acc + (the int16 pair sums of codes u x activations s) x int16 scales c, in int32 lanes */
FORCE_INLINE __m256i kdot(__m256i acc, __m256i u, __m256i s, __m256i c) {
#ifdef FT_VNNI
    return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), c);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), c));
#endif
}

#ifdef FT_AVX512
/* Q6_K's codes of sub-blocks k, k + 1 (k even: groups 4h + s, 4h + s + 1, h = k / 4, s = k % 4) as
 * one 512-bit vector straight from the super-block: the low (s = 0) or high (s = 2) nibbles of the
 * 64 bytes ql[64 h ..] (sub-block k from the first 32, k + 1 from the next), each with its two high
 * bits, bits 2s, 2s + 1 (first half) and 2s + 2, 2s + 3 (second half) of the 32 bytes qh[32 h ..],
 * moved to bits 4, 5 by a per-half 16-bit shift (the bits a shift carries over from the
 * neighbouring byte are masked off). The codes decode8 gives, without its eight 256-bit vectors
 * per row kept live (two rows of them spilled) nor an insert per pair. */
FORCE_INLINE __m512i q6k_pair(const uint8_t *blk, const int k) {
    const int h = k >> 2, s = k & 3;
    const __m512i l = _mm512_loadu_si512((const void *)(blk + 64 * h));
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
    const __m512i nib = _mm512_and_si512(s ? _mm512_srli_epi16(l, 4) : l, _mm512_set1_epi8(0x0f));
    const __m512i two = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i hb = s ? _mm512_srlv_epi16(qh, two)                                  /* bits 4, 5 | 6, 7 */
                         : _mm512_sllv_epi16(qh, _mm512_sub_epi16(_mm512_set1_epi16(4), two)); /* 0, 1 | 2, 3 */
    return _mm512_ternarylogic_epi32(nib, hb, _mm512_set1_epi8(0x30), 0xF8);           /* nib | (hb & 0x30) */
}

/* Q4_K / Q5_K: the 6-bit sub-scales and mins of R <= 4 rows' super-blocks (kscales' values) from
 * their 12 scale bytes at once, in vector registers (no scalar unpack per row): row r's sc_j at
 * word 16 (r % 2) + j of tab[r / 2], its m_j at word 16 (r % 2) + 8 + j. Per 16-byte header, with
 * a, b, c its dwords at 4, 8, 12: sc_0..3 = a & 63, sc_4..7 = (c & 15) | (a >> 2 & 0x30),
 * m_0..3 = b & 63, m_4..7 = (c >> 4 & 15) | (b >> 2 & 0x30), bytewise. */
FORCE_INLINE void k4scales(const uint8_t *const *blk, const int R, __m512i *tab) {
    __m512i h = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)blk[0]));
    if (R > 1) h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)blk[1]), 1);
    if (R > 2) h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)blk[2]), 2);
    if (R > 3) h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)blk[3]), 3);
    const __m512i acbc = _mm512_shuffle_epi8(h, _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)));
    const __m512i x0a0b = _mm512_shuffle_epi8(h, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11)));
    const __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(acbc, _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0, 0, 4))),
                                        _mm512_broadcast_i32x4(_mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)));
    const __m512i v = _mm512_ternarylogic_epi32(lo, _mm512_srli_epi32(x0a0b, 2), _mm512_set1_epi8(0x30), 0xF8);   /* lo | (hi & 0x30) */
    tab[0] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(v));
    if (R > 2) tab[1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1));
}
#endif

/* res[r][t] = <k-quant row wr[r], x_t> on the per-256 activations: per super-block the codes'
 * integer dots times the integer sub-scales summed in int32 lanes (maddubs never saturates:
 * codes <= 63, |x| <= 127), the offsets from the int16 sums, one convert + fma per term. The
 * AVX-512 loop takes two sub-blocks per instruction and folds its halves in integer: the same
 * lanes, bit for bit. R rows of one type (R a compile-time count) go through each super-block
 * together: one row's result does not depend on R (each row's lanes and float steps are the
 * same), but the rows' latency chains overlap and one token's activations are loaded once. */
FORCE_INLINE void krow(const int type, const uint8_t *const *wr, const int R, int n, const kview *X,
                       float (*res)[NTMAX], const int NT, const int narrow) {
    const int bs = ggml_bytes256(type);
    __m256 acc[4][NTMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int g8 = 0; g8 < n / 256; g8++) {
        __m256i isum[4][NTMAX], sc[4], oc[4];
        float d[4], dm[4];
#ifdef FT_AVX512
        __m512i i2[4][NTMAX];
        const __m512i q4sh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        const __m512i quarter = _mm512_setr_epi64(0, 0, 0x0001000100010001LL, 0x0001000100010001LL, 0x0002000200020002LL,
                                                  0x0002000200020002LL, 0x0003000300030003LL, 0x0003000300030003LL);
        __m256i wv[4][8];
        /* Q4_K / Q5_K sub-scales from k4scales' tables, for rows of up to four super-blocks (768
         * wide: 1.10x from DRAM, 1.18x in L2 with GGML_TILE_ROWS; 2048 wide from DRAM: 0.91-0.98x,
         * the four rows' headers waited on together, so those keep kscales per row) */
        const int k4 = (type == GT_Q4_K || type == GT_Q5_K) && narrow;   /* (a compile-time constant) */
        __m512i tab[2];
        const uint8_t *blks[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = blks[r] = wr[r] + (int64_t)bs * g8;
            for (int o = 0; o < bs; o += 64) PREFETCH(blk + o);
            __m256 ws[2], os[2];
            if (type != GT_Q4_K && type != GT_Q6_K) decode8(type, blk, wv[r], ws, os);   /* (its float scales unused: dropped) */
            if (k4) kd_dm(blk, &d[r], &dm[r]);
            else kscales(type, blk, &sc[r], &oc[r], &d[r], &dm[r]);
            for (int t = 0; t < NT; t++) i2[r][t] = _mm512_setzero_si512();
        }
        if (k4) {   /* oc: words m_0 m_0 m_1 m_1 .. m_7 m_7 (one min per two groups of 16) */
            k4scales(blks, R, tab);
            for (int r = 0; r < R; r++)
                oc[r] = _mm512_castsi512_si256(_mm512_permutexvar_epi16(
                    _mm512_add_epi16(_mm512_srli_epi16(_mm512_setr_epi32(0x00010000, 0x00030002, 0x00050004, 0x00070006, 0x00090008, 0x000b000a, 0x000d000c, 0x000f000e,
                                                                         0, 0, 0, 0, 0, 0, 0, 0), 1),
                                     _mm512_set1_epi16((short)(16 * (r & 1) + 8))), tab[r >> 1]));
        }
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {   /* sub-blocks k, k + 1: groups 2k .. 2k + 3, 8 int16 lanes each */
            __m512i xq[NTMAX];
            for (int t = 0; t < NT; t++) xq[t] = _mm512_loadu_si512((const void *)(X[t].q + 256 * g8 + 32 * k));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = wr[r] + (int64_t)bs * g8;
                const __m512i w2 = type == GT_Q4_K   /* Q4_K: both from the 32 bytes they share, no insert */
                    ? _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 16 * k))),
                                                         q4sh), _mm512_set1_epi8(0x0f))
                    : type == GT_Q6_K ? q6k_pair(blk, k)
                    : _mm512_inserti64x4(_mm512_castsi256_si512(wv[r][k]), wv[r][k + 1], 1);
                const __m512i c = k4   /* words: sc_k (low half), sc_k+1 (high half) */
                    ? _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_srli_epi16(quarter, 1), _mm512_set1_epi16((short)(16 * (r & 1) + k))), tab[r >> 1])
                    : _mm512_permutexvar_epi16(_mm512_add_epi16(quarter, _mm512_set1_epi16((short)(2 * k))), _mm512_zextsi256_si512(sc[r]));
                for (int t = 0; t < NT; t++) {
                    const __m512i p = _mm512_maddubs_epi16(w2, xq[t]);
#ifdef FT_VNNI
                    i2[r][t] = _mm512_dpwssd_epi32(i2[r][t], p, c);
#else
                    i2[r][t] = _mm512_add_epi32(i2[r][t], _mm512_madd_epi16(p, c));
#endif
                }
            }
        }
        for (int r = 0; r < R; r++)
            for (int t = 0; t < NT; t++)
                isum[r][t] = _mm256_add_epi32(_mm512_castsi512_si256(i2[r][t]), _mm512_extracti64x4_epi64(i2[r][t], 1));
#else
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = wr[r] + (int64_t)bs * g8;
            for (int o = 0; o < bs; o += 64) PREFETCH(blk + o);
            __m256i wv[8];
            __m256 ws[2], os[2];
            decode8(type, blk, wv, ws, os);   /* (its float scales unused: dropped by the compiler) */
            kscales(type, blk, &sc[r], &oc[r], &d[r], &dm[r]);
            for (int t = 0; t < NT; t++) isum[r][t] = _mm256_setzero_si256();
            const __m256i s_lo = _mm256_permute2x128_si256(sc[r], sc[r], 0x00), s_hi = _mm256_permute2x128_si256(sc[r], sc[r], 0x11);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {   /* groups 2k, 2k + 1: bytes a, a + 2 of their 128-bit half */
                const int a = (4 * k) & 15;
                const __m256i sel = _mm256_set_m128i(_mm_set1_epi16((short)((a + 3) << 8 | (a + 2))), _mm_set1_epi16((short)((a + 1) << 8 | a)));
                const __m256i c = _mm256_shuffle_epi8(k < 4 ? s_lo : s_hi, sel);
                for (int t = 0; t < NT; t++)
                    isum[r][t] = kdot(isum[r][t], wv[k], _mm256_loadu_si256((const __m256i *)(X[t].q + 256 * g8 + 32 * k)), c);
            }
        }
#endif
        for (int t = 0; t < NT; t++) {
            const float dx = X[t].d[g8];
            const __m256i bsx = _mm256_loadu_si256((const __m256i *)(X[t].bs + 16 * g8));
            for (int r = 0; r < R; r++) {
                const __m256i o = _mm256_madd_epi16(bsx, oc[r]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(d[r] * dx), acc[r][t]);
                acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(o), _mm256_set1_ps(dm[r] * dx), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) res[r][t] = hsum8(acc[r][t]);
}

/* One row -> bf16 (the prefill tiles' panel): decode8's codes, scales and offsets, each
 * weight ws * code - os; a legacy row's last < 8 blocks through the scalar dequantization. */
FORCE_INLINE void row_bf16(const int type, const uint8_t *w, int K, uint16_t *dst) {
    const int k6 = G_PER16(type), sg = G_SIGNED(type), bs = ggml_bytes256(type);
    for (int g8 = 0; g8 < K / 256; g8++) {
        __m256i wv[8];
        __m256 ws[2], os[2];
        float s[16], o[16];
        decode8(type, w + (int64_t)bs * g8, wv, ws, os);
        _mm256_storeu_ps(s, ws[0]);
        _mm256_storeu_ps(o, os[0]);
        if (k6) { _mm256_storeu_ps(s + 8, ws[1]); _mm256_storeu_ps(o + 8, os[1]); }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const int a = k6 ? 2 * k : k, b = k6 ? 2 * k + 1 : k;
            codes_bf16(wv[k], s[a], s[b], sg ? 0.f : o[a], sg ? 0.f : o[b], dst + 256 * g8 + 32 * k);
        }
    }
    float f[32];
    for (int b = K / 256 * 8; b < K / 32; b++) {
        ggml_dequant_row(type, w + (int64_t)bs / 8 * b, 32, f);
        for (int i = 0; i < 32; i++) dst[32 * b + i] = f32_to_bf16(f[i]);
    }
}

#define ROW_BF16(t) case t: row_bf16(t, w, K, dst); return 1;
int ggml_row_bf16(int type, const uint8_t *w, int K, uint16_t *dst) {
    switch (type) {   /* one entry per type (ft_kernels.h's ggml_bytes256 lists the same) */
    ROW_BF16(GT_Q8_0) ROW_BF16(GT_Q4_0) ROW_BF16(GT_Q4_1) ROW_BF16(GT_Q5_0) ROW_BF16(GT_Q5_1)
    ROW_BF16(GT_IQ4_NL) ROW_BF16(GT_MXFP4) ROW_BF16(GT_Q2_K) ROW_BF16(GT_Q3_K) ROW_BF16(GT_Q4_K)
    ROW_BF16(GT_Q5_K) ROW_BF16(GT_Q6_K) ROW_BF16(GT_TQ1_0) ROW_BF16(GT_TQ2_0)
    default: return 0;
    }
}

#else /* portable: each block dequantized to floats (ggml_dense.c, as the reference), dot with int8 x */

int ggml_row_bf16(int type, const uint8_t *w, int K, uint16_t *dst) {
    if (!ggml_bytes256(type)) return 0;
    const int be = ggml_blocks32(type) ? 32 : 256, bb = ggml_bytes256(type) / (256 / be);
    float f[256];
    for (int c = 0; c < K / be; c++) {
        ggml_dequant_row(type, w + (int64_t)bb * c, be, f);
        for (int i = 0; i < be; i++) dst[be * c + i] = f32_to_bf16(f[i]);
    }
    return 1;
}


FORCE_INLINE void grow(const int type, const uint8_t *w, int n, const xview *X, float *res, const int NT) {
    float acc[NTMAX] = {0};
    float wf[256];
    const int be = ggml_blocks32(type) ? 32 : 256, bb = ggml_bytes256(type) / (256 / be);
    for (int c = 0; c < n / be; c++) {
        ggml_dequant_row(type, w + (int64_t)bb * c, be, wf);
        for (int b = 0; b < be / 32; b++) {
            const int gb = c * be / 32 + b;
            for (int t = 0; t < NT; t++) {
                float p = 0.f;
                int sq = 0;
                for (int i = 0; i < 32; i++) { p += wf[32 * b + i] * (float)X[t].q[32 * gb + i]; sq += X[t].q[32 * gb + i]; }
                acc[t] += p * X[t].d[gb];
                if (ft_ggml_act_llama && (type == GT_Q4_1 || type == GT_Q5_1)) {   /* the min times q8_1's fp16 s */
                    uint16_t m; memcpy(&m, w + (int64_t)bb * c + 2, 2);
                    acc[t] += f16_to_f32(m) * (X[t].sm[gb] - X[t].d[gb] * (float)sq);
                }
            }
        }
    }
    for (int t = 0; t < NT; t++) res[t] = acc[t];
}

/* the per-256 activations' dot (see the AVX2 krow): each super-block dequantized, fp32 sums */
FORCE_INLINE void krow(const int type, const uint8_t *const *wr, const int R, int n, const kview *X,
                       float (*res)[NTMAX], const int NT, const int narrow) {
    (void)narrow;
    for (int r = 0; r < R; r++) {
        float acc[NTMAX] = {0}, wf[256];
        for (int g8 = 0; g8 < n / 256; g8++) {
            ggml_dequant_row(type, wr[r] + (int64_t)ggml_bytes256(type) * g8, 256, wf);
            for (int t = 0; t < NT; t++) {
                float p = 0.f;
                for (int i = 0; i < 256; i++) p += wf[i] * (float)X[t].q[256 * g8 + i];
                acc[t] += p * X[t].d[g8];
            }
        }
        for (int t = 0; t < NT; t++) res[r][t] = acc[t];
    }
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
    /* one entry per type (ft_kernels.h's ggml_bytes256 lists the same) */
    case GT_Q8_0: GROW_NT(GT_Q8_0) break;
    case GT_Q4_0: GROW_NT(GT_Q4_0) break;
    case GT_Q4_1: GROW_NT(GT_Q4_1) break;
    case GT_Q5_0: GROW_NT(GT_Q5_0) break;
    case GT_Q5_1: GROW_NT(GT_Q5_1) break;
    case GT_IQ4_NL: GROW_NT(GT_IQ4_NL) break;
    case GT_MXFP4: GROW_NT(GT_MXFP4) break;
    case GT_Q2_K: GROW_NT(GT_Q2_K) break;
    case GT_Q3_K: GROW_NT(GT_Q3_K) break;
    case GT_Q4_K: GROW_NT(GT_Q4_K) break;
    case GT_Q5_K: GROW_NT(GT_Q5_K) break;
    case GT_Q6_K: GROW_NT(GT_Q6_K) break;
    case GT_TQ1_0: GROW_NT(GT_TQ1_0) break;
    case GT_TQ2_0: GROW_NT(GT_TQ2_0) break;
    default: for (int t = 0; t < nt; t++) res[t] = NAN;
    }
}

/* The k-quants whose one-token rows go four at a time through krow (the rest two at a time: four
 * rows of their decoded codes spill): Q4_K, and Q6_K where AVX-512 decodes its pairs in place. */
#ifdef FT_AVX512
#define KROW4(t) ((t) == GT_Q4_K || (t) == GT_Q6_K)
#else
#define KROW4(t) ((t) == GT_Q4_K)
#endif

/* rows wr[0..R) of the k-quant `type` on the per-256 activations (ft_ggml_k256): one token's
 * rows four (or two) at a time through krow, several tokens' one at a time */
static void ggml_krows(int type, const uint8_t *const *wr, int R, int n, const uint8_t *const *xp, int nt,
                       float (*res)[NTMAX]) {
    kview X[NTMAX];
    for (int t = 0; t < nt; t++) X[t] = kv(xp[t], n);
#define KROWS(type, nw)                                                                             \
    if (nt == 1) {                                                                                \
        int r = 0;                                                                                \
        for (; KROW4(type) && r + 4 <= R; r += 4) krow(type, wr + r, 4, n, X, res + r, 1, nw);      \
        for (; r + 2 <= R; r += 2) krow(type, wr + r, 2, n, X, res + r, 1, nw);                       \
        if (r < R) krow(type, wr + r, 1, n, X, res + r, 1, nw);                                       \
    } else {                                                                                      \
        for (int r = 0; r < R; r++) switch (nt) {                                                 \
            case 2: krow(type, wr + r, 1, n, X, res + r, 2, nw); break;                               \
            case 3: krow(type, wr + r, 1, n, X, res + r, 3, nw); break;                               \
            default: krow(type, wr + r, 1, n, X, res + r, 4, nw); }                                   \
    }
    switch (type) {
    case GT_Q2_K: KROWS(GT_Q2_K, 0) break;
    case GT_Q3_K: KROWS(GT_Q3_K, 0) break;
    case GT_Q4_K: if (n <= K4_MAX_WIDTH) { KROWS(GT_Q4_K, 1) } else { KROWS(GT_Q4_K, 0) } break;
    case GT_Q5_K: if (n <= K4_MAX_WIDTH) { KROWS(GT_Q5_K, 1) } else { KROWS(GT_Q5_K, 0) } break;
    default: KROWS(GT_Q6_K, 0) break;
    }
#undef KROWS
}

static inline int is_kquant(int type) {
    return type == GT_Q2_K || type == GT_Q3_K || type == GT_Q4_K || type == GT_Q5_K || type == GT_Q6_K;
}

/* res[r][t] = <row wr[r] of type *(int32 *)sr[r], prepared x_t> (a tile may mix the gate and up
 * halves, which can differ in type). */
void ggml_dot_tile(const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                   const uint8_t *const *xp, int nt, float (*res)[NTMAX]) {
    xview X[NTMAX];
    for (int t = 0; t < nt; t++) X[t] = xv(xp[t], n);
    for (int r = 0; r < R; ) {
        int32_t type; memcpy(&type, sr[r], 4);
        if (ft_ggml_k256 && n % 256 == 0 && is_kquant(type)) {   /* the run of rows of this type together */
            int e = r + 1;
            for (int32_t te; e < R && (memcpy(&te, sr[e], 4), te == type); e++) {}
            ggml_krows(type, wr + r, e - r, n, xp, nt, res + r);
            r = e;
            continue;
        }
        if (!ggml_iq_row(type, wr[r], n, xp, nt, res[r]))   /* the i-quants: ggml_iq.c */
            ggml_row(type, wr[r], n, X, nt, res[r]);
        r++;
    }
}
