/* llama.cpp's lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) in ggml.c's
 * scheme: dots of raw GGUF rows with activations prepared per 32 (int8 + fp32 scale, ggml_prep).
 *
 * An i-quant weight is a signed grid value: each group of 8 (IQ2, IQ1) or 4 (IQ3) weights is one
 * point of a fixed grid (ggml_iq_grids.h, generated from the gguf package), with a sign per
 * weight. Every 32 weights decode in registers to 32 unsigned magnitudes and 32 signs (IQ1:
 * 8 * grid +- 1, the delta of 1/8 made integer), the signs go onto the activations
 * (vpsignb), and one u8 x s8 integer dot (vpdpbusd on AVX512-VNNI, else maddubs + madd) is
 * scaled per 16 lanes by weight scale x activation scale. Sub-block scales: per 32 weights
 * (IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S) or per 16 (IQ2_XS, IQ2_S, IQ1_M): the dot's 8 int32 lanes
 * hold 4 products each, so lanes 0-3 are the first 16 weights and 4-7 the second.
 * With AVX-512 (+ BMI2), the per-32 types (IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S) take iq_grow_pairs instead
 * (the per-16 IQ2_XS, IQ2_S: iq_grow_pairs16):
 * 64 weights per dot, their grid points in one gather, the scales per super-block (docs/gguf.md).
 * Layouts: quant/ggml_iquants.py. Row dequantization (prefill GEMMs) is at the end. */
#include "ft_kernels.h"
#include "ggml_iq_grids.h"

enum { GT_IQ2_XXS = 16, GT_IQ2_XS = 17, GT_IQ3_XXS = 18, GT_IQ1_S = 19, GT_IQ3_S = 21, GT_IQ2_S = 22,
       GT_IQ1_M = 29 };

static inline int iq_block_bytes(int type) {
    switch (type) {
    case GT_IQ2_XXS: return 66;
    case GT_IQ2_XS: return 74;
    case GT_IQ2_S: return 82;
    case GT_IQ3_XXS: return 98;
    case GT_IQ3_S: return 110;
    case GT_IQ1_S: return 50;
    case GT_IQ1_M: return 56;
    default: return 0;
    }
}

FT_HIDDEN int ggml_iq_type(int type) { return iq_block_bytes(type) != 0; }

static inline uint16_t u16at(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t u32at(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* The super-block's fp16 d as float (IQ1_M: assembled from the top nibbles of its 4 scales). */
static inline float iq_d(int type, const uint8_t *blk) {
    uint16_t h = type == GT_IQ1_M ? (uint16_t)((u16at(blk + 48) >> 12) | ((u16at(blk + 50) >> 8) & 0x00f0)
                                               | ((u16at(blk + 52) >> 4) & 0x0f00) | (u16at(blk + 54) & 0xf000))
                                  : u16at(blk);
#ifdef FT_AVX2
    return _cvtsh_ss(h);
#else
    return f16_to_f32(h);
#endif
}

/* The scales of sub-block ib (32 weights) of a super-block with scale d: weight i = sc[i / 16] *
 * code_i, exactly the products gguf.quants.dequantize forms (IQ1: the 1/8 of the delta moved into sc). */
static inline void iq_scales(const int type, const uint8_t *blk, int ib, float d, float *sc) {
    switch (type) {
    case GT_IQ2_XXS: sc[0] = sc[1] = d * (0.5f + (float)(blk[2 + 8 * ib + 7] >> 4)) * 0.25f; break;
    case GT_IQ3_XXS: sc[0] = sc[1] = d * (0.5f + (float)(blk[66 + 4 * ib + 3] >> 4)) * 0.5f; break;
    case GT_IQ2_XS:
    case GT_IQ2_S: {
        const uint8_t s = blk[(type == GT_IQ2_XS ? 66 : 74) + ib];
        sc[0] = d * (0.5f + (float)(s & 15)) * 0.25f;
        sc[1] = d * (0.5f + (float)(s >> 4)) * 0.25f;
        break;
    }
    case GT_IQ3_S: sc[0] = sc[1] = d * (float)(1 + 2 * ((blk[106 + ib / 2] >> 4 * (ib & 1)) & 15)); break;
    case GT_IQ1_S: sc[0] = sc[1] = (d * (float)(2 * ((blk[34 + 2 * ib + 1] >> 4) & 7) + 1)) * 0.125f; break;
    default: {   /* GT_IQ1_M: a 3-bit scale per 16 */
        const uint16_t s = u16at(blk + 48 + 2 * (ib / 2));
        sc[0] = (d * (float)(2 * ((s >> (6 * (ib & 1))) & 7) + 1)) * 0.125f;
        sc[1] = (d * (float)(2 * ((s >> (6 * (ib & 1) + 3)) & 7) + 1)) * 0.125f;
    }
    }
}

/* Sub-block ib -> 32 signed int8 codes (scalar decode: the portable dots and the dequantization). */
static void iq_codes(int type, const uint8_t *blk, int ib, int8_t *q) {
    for (int l = 0; l < 4; l++) {   /* 8 weights at a time */
        uint64_t g = 0;              /* 8 bytes: magnitudes (IQ2, IQ3) or -1/0/1 (IQ1) */
        uint8_t s = 0;               /* sign bits */
        int delta = 0;
        switch (type) {
        case GT_IQ2_XXS: {
            const uint8_t *p = blk + 2 + 8 * ib;
            g = iq2xxs_grid[p[l]];
            s = ksigns_iq2xs[(u32at(p + 4) >> (7 * l)) & 127];
            break;
        }
        case GT_IQ3_XXS: {
            const uint8_t *p = blk + 2 + 8 * ib;
            g = (uint64_t)iq3xxs_grid[p[2 * l]] | (uint64_t)iq3xxs_grid[p[2 * l + 1]] << 32;
            s = ksigns_iq2xs[(u32at(blk + 66 + 4 * ib) >> (7 * l)) & 127];
            break;
        }
        case GT_IQ2_XS: {
            const uint16_t v = u16at(blk + 2 + 2 * (4 * ib + l));
            g = iq2xs_grid[v & 511];
            s = ksigns_iq2xs[v >> 9];
            break;
        }
        case GT_IQ2_S:
            g = iq2s_grid[blk[2 + 4 * ib + l] | ((blk[66 + ib] >> (2 * l)) & 3) << 8];
            s = blk[34 + 4 * ib + l];
            break;
        case GT_IQ3_S: {
            const int k = 8 * ib + 2 * l;
            const uint8_t qh = blk[66 + ib];
            g = (uint64_t)iq3s_grid[blk[2 + k] | ((qh >> (2 * l)) & 1) << 8]
              | (uint64_t)iq3s_grid[blk[3 + k] | ((qh >> (2 * l + 1)) & 1) << 8] << 32;
            s = blk[74 + 4 * ib + l];
            break;
        }
        case GT_IQ1_S: {
            const uint16_t qh = u16at(blk + 34 + 2 * ib);
            g = iq1s_grid[blk[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7) << 8];
            delta = qh & 0x8000 ? -1 : 1;
            break;
        }
        default: {   /* GT_IQ1_M */
            const int h = (blk[32 + 2 * ib + l / 2] >> (4 * (l & 1))) & 15;
            g = iq1s_grid[blk[4 * ib + l] | (h & 7) << 8];
            delta = h & 8 ? -1 : 1;
        }
        }
        for (int j = 0; j < 8; j++) {
            const int8_t b = (int8_t)(g >> (8 * j));
            q[8 * l + j] = (int8_t)(delta ? 8 * b + delta : ((s >> j) & 1) ? -b : b);
        }
    }
}

#ifdef FT_AVX2

/* 32 sign bits -> 32 bytes of +1 / -1 (the second operand of vpsignb) */
FORCE_INLINE __m256i sign_bytes(uint32_t s) {
#ifdef FT_AVX512
    return _mm256_or_si256(_mm256_movm_epi8((__mmask32)s), _mm256_set1_epi8(1));
#else
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((int64_t)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), shuf);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits), _mm256_set1_epi8(1));
#endif
}

FORCE_INLINE uint32_t ks4(uint32_t a) {   /* 4 x 7-bit sign indices -> 32 sign bits */
    return (uint32_t)ksigns_iq2xs[a & 127] | (uint32_t)ksigns_iq2xs[(a >> 7) & 127] << 8
         | (uint32_t)ksigns_iq2xs[(a >> 14) & 127] << 16 | (uint32_t)ksigns_iq2xs[(a >> 21) & 127] << 24;
}

/* Sub-block ib in registers: u = 32 magnitudes, sg = the signs (+-1 bytes) to put on x. */
FORCE_INLINE void iq_sub(const int type, const uint8_t *blk, int ib, __m256i *u, __m256i *sg) {
    switch (type) {
    case GT_IQ2_XXS: {
        const uint8_t *p = blk + 2 + 8 * ib;
        *u = _mm256_set_epi64x((int64_t)iq2xxs_grid[p[3]], (int64_t)iq2xxs_grid[p[2]],
                               (int64_t)iq2xxs_grid[p[1]], (int64_t)iq2xxs_grid[p[0]]);
        *sg = sign_bytes(ks4(u32at(p + 4)));
        return;
    }
    case GT_IQ3_XXS: {
        const uint8_t *p = blk + 2 + 8 * ib;
        *u = _mm256_set_epi32((int)iq3xxs_grid[p[7]], (int)iq3xxs_grid[p[6]], (int)iq3xxs_grid[p[5]],
                              (int)iq3xxs_grid[p[4]], (int)iq3xxs_grid[p[3]], (int)iq3xxs_grid[p[2]],
                              (int)iq3xxs_grid[p[1]], (int)iq3xxs_grid[p[0]]);
        *sg = sign_bytes(ks4(u32at(blk + 66 + 4 * ib)));
        return;
    }
    case GT_IQ2_XS: {
        const uint8_t *p = blk + 2 + 8 * ib;
        const uint16_t v0 = u16at(p), v1 = u16at(p + 2), v2 = u16at(p + 4), v3 = u16at(p + 6);
        *u = _mm256_set_epi64x((int64_t)iq2xs_grid[v3 & 511], (int64_t)iq2xs_grid[v2 & 511],
                               (int64_t)iq2xs_grid[v1 & 511], (int64_t)iq2xs_grid[v0 & 511]);
        *sg = sign_bytes((uint32_t)ksigns_iq2xs[v0 >> 9] | (uint32_t)ksigns_iq2xs[v1 >> 9] << 8
                         | (uint32_t)ksigns_iq2xs[v2 >> 9] << 16 | (uint32_t)ksigns_iq2xs[v3 >> 9] << 24);
        return;
    }
    case GT_IQ2_S: {
        const uint8_t *p = blk + 2 + 4 * ib;
        const int qh = blk[66 + ib];
        *u = _mm256_set_epi64x((int64_t)iq2s_grid[p[3] | (qh >> 6 & 3) << 8], (int64_t)iq2s_grid[p[2] | (qh >> 4 & 3) << 8],
                               (int64_t)iq2s_grid[p[1] | (qh >> 2 & 3) << 8], (int64_t)iq2s_grid[p[0] | (qh & 3) << 8]);
        *sg = sign_bytes(u32at(blk + 34 + 4 * ib));
        return;
    }
    case GT_IQ3_S: {
        const uint8_t *p = blk + 2 + 8 * ib;
        const int qh = blk[66 + ib];
        *u = _mm256_set_epi32((int)iq3s_grid[p[7] | (qh << 1 & 256)], (int)iq3s_grid[p[6] | (qh << 2 & 256)],
                              (int)iq3s_grid[p[5] | (qh << 3 & 256)], (int)iq3s_grid[p[4] | (qh << 4 & 256)],
                              (int)iq3s_grid[p[3] | (qh << 5 & 256)], (int)iq3s_grid[p[2] | (qh << 6 & 256)],
                              (int)iq3s_grid[p[1] | (qh << 7 & 256)], (int)iq3s_grid[p[0] | (qh << 8 & 256)]);
        *sg = sign_bytes(u32at(blk + 74 + 4 * ib));
        return;
    }
    case GT_IQ1_S: {   /* codes 8 g + delta (g in -1, 0, 1): signed; |codes| and their signs */
        const uint8_t *p = blk + 2 + 4 * ib;
        const int qh = u16at(blk + 34 + 2 * ib);
        __m256i g = _mm256_set_epi64x((int64_t)iq1s_grid[p[3] | (qh >> 9 & 7) << 8], (int64_t)iq1s_grid[p[2] | (qh >> 6 & 7) << 8],
                                      (int64_t)iq1s_grid[p[1] | (qh >> 3 & 7) << 8], (int64_t)iq1s_grid[p[0] | (qh & 7) << 8]);
        __m256i c = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), _mm256_set1_epi8(qh & 0x8000 ? -1 : 1));
        *u = _mm256_abs_epi8(c); *sg = c;
        return;
    }
    default: {   /* GT_IQ1_M: high index bits and the delta's sign per 8 weights */
        const uint8_t *p = blk + 4 * ib;
        const int h0 = blk[32 + 2 * ib], h1 = blk[33 + 2 * ib];
        __m256i g = _mm256_set_epi64x((int64_t)iq1s_grid[p[3] | (h1 >> 4 & 7) << 8], (int64_t)iq1s_grid[p[2] | (h1 & 7) << 8],
                                      (int64_t)iq1s_grid[p[1] | (h0 >> 4 & 7) << 8], (int64_t)iq1s_grid[p[0] | (h0 & 7) << 8]);
        const __m256i dl = _mm256_set_epi64x(h1 & 0x80 ? -1 : 0x0101010101010101, h1 & 0x08 ? -1 : 0x0101010101010101,
                                             h0 & 0x80 ? -1 : 0x0101010101010101, h0 & 0x08 ? -1 : 0x0101010101010101);
        __m256i c = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), dl);
        *u = _mm256_abs_epi8(c); *sg = c;
    }
    }
}

#if defined(FT_AVX512) && defined(__BMI2__)
/* IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S (one scale per 32): two sub-blocks per 512-bit dot, their signs
 * as a 64-bit mask that negates x, and the 8 sub-block scales of a super-block as one vector. */
#define IQ_PAIRS(t) ((t) == GT_IQ2_XXS || (t) == GT_IQ3_XXS || (t) == GT_IQ3_S || (t) == GT_IQ1_S)

/* 2 x 4 x 7 sign indices (bits 0-27 of a0, a1) -> 64 sign bits: ksigns_iq2xs's bytes are the
 * index with bit 7 = parity of the index, computed here (pdep spreads the 7-bit fields to bytes). */
FORCE_INLINE uint64_t signs64(uint32_t a0, uint32_t a1) {
    const uint64_t s = _pdep_u64((uint64_t)(a0 & 0x0fffffffu) | (uint64_t)(a1 & 0x0fffffffu) << 28,
                                 0x7f7f7f7f7f7f7f7full);
    uint64_t p = s ^ (s >> 4);   /* parity per byte lands in bit 0 (shifts stay inside the byte) */
    p ^= p >> 2;
    p ^= p >> 1;
    return s | (p & 0x0101010101010101ull) << 7;
}

/* Sub-blocks 2k, 2k + 1: u = 64 magnitudes, *neg = the weights whose sign goes onto x. */
FORCE_INLINE __m512i iq_pair(const int type, const uint8_t *blk, int k, __mmask64 *neg) {
    if (type == GT_IQ2_XXS) {
        const uint8_t *p = blk + 2 + 16 * k;
        *neg = signs64(u32at(p + 4), u32at(p + 12));
        /* 8 grid points of 8 bytes (indices: bytes 0-3 and 8-11) in one gather (2 KB table) */
        const __m128i ix = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0));
        return _mm512_i32gather_epi64(_mm256_cvtepu8_epi32(ix), (const void *)iq2xxs_grid, 8);
    }
    if (type == GT_IQ3_XXS) {
        const uint8_t *p = blk + 2 + 16 * k;
        *neg = signs64(u32at(blk + 66 + 8 * k), u32at(blk + 70 + 8 * k));
        /* 16 grid points of 4 bytes: one gather (1 KB table, L1-resident) */
        return _mm512_i32gather_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)), (const void *)iq3xxs_grid, 4);
    }
    if (type == GT_IQ3_S) {   /* the sign bits are stored as they are; 9-bit indices: the 9th from qh */
        uint64_t sg;
        memcpy(&sg, blk + 74 + 8 * k, 8);
        *neg = sg;
        const __m512i hb = _mm512_srlv_epi32(_mm512_set1_epi32((int)u16at(blk + 66 + 2 * k)),
                                             _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        const __m512i ix = _mm512_or_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * k))),
                                           _mm512_slli_epi32(_mm512_and_si512(hb, _mm512_set1_epi32(1)), 8));
        return _mm512_i32gather_epi32(ix, (const void *)iq3s_grid, 4);   /* 2 KB table */
    }
    /* GT_IQ1_S: codes 8 g + delta (g in -1, 0, 1) = 8 (g + 1) + (delta - 8): u = g + 1 >= 0, no
     * signs to apply; the caller scales by 8 and removes the (8 - delta) x (the block sums of x) */
    const uint8_t *p = blk + 2 + 8 * k;
    /* 8 grid indices: 8 low bits from qs, 3 high bits from each sub-block's qh; one gather */
    const __m256i hi = _mm256_sllv_epi32(_mm256_set1_epi32((int)u32at(blk + 34 + 4 * k)), _mm256_setr_epi32(8, 5, 2, 0, 0, 0, 0, 0));
    const __m256i hs = _mm256_srlv_epi32(hi, _mm256_setr_epi32(0, 0, 0, 1, 8, 11, 14, 17));   /* bits 8-10: the 3 high bits */
    const __m256i ix = _mm256_ternarylogic_epi32(hs, _mm256_set1_epi32(0x700), _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)), 0xea);   /* (hs & 0x700) | qs */
    *neg = 0;
    return _mm512_add_epi8(_mm512_i32gather_epi64(ix, (const void *)iq1s_grid, 8), _mm512_set1_epi8(1));
}

/* The super-block's 8 sub-block scales, each the float iq_scales forms (d x odd integer, / 8 or / 4) */
FORCE_INLINE __m256 iq_scales8(const int type, const uint8_t *blk, float d) {
    __m256i ls;
    if (type == GT_IQ2_XXS)   /* top nibble of each sub-block's second word */
        ls = _mm512_cvtepi64_epi32(_mm512_srli_epi64(_mm512_loadu_si512((const void *)(blk + 2)), 60));
    else if (type == GT_IQ3_XXS)
        ls = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(blk + 66)), 28);
    else if (type == GT_IQ3_S)   /* a nibble per sub-block, low nibble first */
        ls = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u32at(blk + 106)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                              _mm256_set1_epi32(15));
    else
        ls = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + 34))), 12),
                              _mm256_set1_epi32(7));
    const __m256 odd = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1)));
    const __m256 dodd = _mm256_mul_ps(_mm256_set1_ps(d), odd);
    return type == GT_IQ3_S ? dodd : _mm256_mul_ps(dodd, _mm256_set1_ps(type == GT_IQ3_XXS ? 0.25f : 0.125f));
}

/* Lanes 0-7 of the accumulator sum the even sub-blocks and 8-15 the odd ones: iq_grow's acc[t][0]
 * and acc[t][1], the same products in the same order for IQ2_XXS / IQ3_XXS (IQ1_S: + corr). */
FORCE_INLINE void iq_grow_pairs(const int type, const uint8_t *w, int n, const int8_t *const *xq,
                                const float *const *xd, float *res, const int NT) {
    const int bs = iq_block_bytes(type);
    __m512 acc[NTMAX];
    __m256 corr[NTMAX];   /* IQ1_S: (8 - delta) x the block sums, per lane */
    for (int t = 0; t < NT; t++) { acc[t] = _mm512_setzero_ps(); corr[t] = _mm256_setzero_ps(); }
    for (int sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = w + (int64_t)bs * sb;
        for (int o = 0; o < bs; o += 64) PREFETCH(blk + o);
        __m256 ws = iq_scales8(type, blk, iq_d(type, blk));
        if (type == GT_IQ1_S) {   /* xd + n / 32: the block sums d * sum(q) (ggml_prep's s32) */
            const __m256i neg_delta = _mm256_srli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + 34))), 15);
            const __m256 cs = _mm256_mul_ps(ws, _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_set1_epi32(7), _mm256_add_epi32(neg_delta, neg_delta))));
            for (int t = 0; t < NT; t++) corr[t] = _mm256_fmadd_ps(cs, _mm256_loadu_ps(xd[t] + n / 32 + 8 * sb), corr[t]);
            ws = _mm256_mul_ps(ws, _mm256_set1_ps(8.f));
        }
        __m512 D[NTMAX];
        for (int t = 0; t < NT; t++)
            D[t] = _mm512_castps256_ps512(_mm256_mul_ps(ws, _mm256_loadu_ps(xd[t] + 8 * sb)));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __mmask64 neg;
            const __m512i u = iq_pair(type, blk, k, &neg);
            const __m512i sel = _mm512_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k,
                                                  2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
            for (int t = 0; t < NT; t++) {
                __m512i x = _mm512_loadu_si512((const void *)(xq[t] + 256 * sb + 64 * k));
                if (type != GT_IQ1_S) x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                const __m512i p = dot512_u8s8(u, x);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(sel, D[t]), acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        res[t] = hsum8(_mm256_sub_ps(_mm256_add_ps(_mm512_castps512_ps256(acc[t]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1))),
                                     corr[t]));
}

/* IQ2_XS, IQ2_S (one scale per 16) in pairs of sub-blocks: 8 grid points of 8 bytes in one gather,
 * the signs as a 64-bit mask (IQ2_XS: the 7-bit sign indices pext'ed out of the 9-bit grid
 * indices' words; IQ2_S: the sign bytes as stored), the 16 scales of a super-block as one vector. */
#define IQ_PAIRS16(t) ((t) == GT_IQ2_XS || (t) == GT_IQ2_S)

FORCE_INLINE __m512i iq_pair16(const int type, const uint8_t *blk, int k, __mmask64 *neg) {
    __m256i ix;
    if (type == GT_IQ2_XS) {
        const uint8_t *p = blk + 2 + 16 * k;
        uint64_t w0, w1;
        memcpy(&w0, p, 8);
        memcpy(&w1, p + 8, 8);
        *neg = signs64((uint32_t)_pext_u64(w0, 0xfe00fe00fe00fe00ull), (uint32_t)_pext_u64(w1, 0xfe00fe00fe00fe00ull));
        ix = _mm256_and_si256(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), _mm256_set1_epi32(511));
        return _mm512_i32gather_epi64(ix, (const void *)iq2xs_grid, 8);   /* 4 KB table */
    }
    uint64_t sg;   /* GT_IQ2_S: 10-bit indices, the top 2 bits from qh */
    memcpy(&sg, blk + 34 + 8 * k, 8);
    *neg = sg;
    const __m256i hb = _mm256_srlv_epi32(_mm256_set1_epi32((int)u16at(blk + 66 + 2 * k)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    ix = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k))),
                         _mm256_slli_epi32(_mm256_and_si256(hb, _mm256_set1_epi32(3)), 8));
    return _mm512_i32gather_epi64(ix, (const void *)iq2s_grid, 8);         /* 8 KB table */
}

/* Lane i of the dot sums weights 4i..4i+3 of the pair: lanes 4j..4j+3 are its j-th 16 weights. */
FORCE_INLINE void iq_grow_pairs16(const int type, const uint8_t *w, int n, const int8_t *const *xq,
                                  const float *const *xd, float *res, const int NT) {
    const int bs = iq_block_bytes(type);
    const __m512i half = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[NTMAX];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = w + (int64_t)bs * sb;
        for (int o = 0; o < bs; o += 64) PREFETCH(blk + o);
        /* scale nibbles, low first: weight group i (16 weights) has d (0.5 + nibble_i) / 4 */
        const __m128i b = _mm_loadl_epi64((const __m128i *)(blk + (type == GT_IQ2_XS ? 66 : 74)));
        const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)));
        const __m512i ls = _mm512_cvtepu8_epi32(nib);
        const __m512 odd = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(ls, ls), _mm512_set1_epi32(1)));
        const __m512 ws = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(iq_d(type, blk)), odd), _mm512_set1_ps(0.125f));
        __m512 D[NTMAX];
        for (int t = 0; t < NT; t++)
            D[t] = _mm512_mul_ps(ws, _mm512_permutexvar_ps(half, _mm512_castps256_ps512(_mm256_loadu_ps(xd[t] + 8 * sb))));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __mmask64 neg;
            const __m512i u = iq_pair16(type, blk, k, &neg);
            const __m512i sel = _mm512_setr_epi32(4 * k, 4 * k, 4 * k, 4 * k, 4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1,
                                                  4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3);
            for (int t = 0; t < NT; t++) {
                __m512i x = _mm512_loadu_si512((const void *)(xq[t] + 256 * sb + 64 * k));
                x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot512_u8s8(u, x)), _mm512_permutexvar_ps(sel, D[t]), acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        res[t] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc[t]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1))));
}
#endif

FORCE_INLINE void iq_grow(const int type, const uint8_t *w, int n, const int8_t *const *xq, const float *const *xd,
                          float *res, const int NT) {
#if defined(FT_AVX512) && defined(__BMI2__)
    if (IQ_PAIRS(type)) { iq_grow_pairs(type, w, n, xq, xd, res, NT); return; }
    if (IQ_PAIRS16(type)) { iq_grow_pairs16(type, w, n, xq, xd, res, NT); return; }
#endif
    const int bs = iq_block_bytes(type);
    const int per16 = type == GT_IQ2_XS || type == GT_IQ2_S || type == GT_IQ1_M;
    __m256 acc[NTMAX][2];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = w + (int64_t)bs * sb;
        for (int o = 0; o < bs; o += 64) PREFETCH(blk + o);
        const float d = iq_d(type, blk);
#pragma GCC unroll 2
        for (int ib = 0; ib < 8; ib++) {
            __m256i u, sg;
            iq_sub(type, blk, ib, &u, &sg);
            float sc[2];
            iq_scales(type, blk, ib, d, sc);
            const __m256 S = per16 ? _mm256_setr_m128(_mm_set1_ps(sc[0]), _mm_set1_ps(sc[1])) : _mm256_set1_ps(sc[0]);
            const int b = 8 * sb + ib;
            for (int t = 0; t < NT; t++) {
                const __m256i x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq[t] + 32 * b)), sg);
                const __m256 D = _mm256_mul_ps(S, _mm256_set1_ps(xd[t][b]));
                acc[t][ib & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(u, x)), D, acc[t][ib & 1]);
            }
        }
    }
    for (int t = 0; t < NT; t++) res[t] = hsum8(_mm256_add_ps(acc[t][0], acc[t][1]));
}

/* One row -> bf16 (the prefill tiles' panel): each weight sc * (signed code), as the dequantization */
FORCE_INLINE void iq_row_bf16(const int type, const uint8_t *w, int K, uint16_t *dst) {
    const int bs = iq_block_bytes(type);
    for (int sb = 0; sb < K / 256; sb++) {
        const uint8_t *blk = w + (int64_t)bs * sb;
        const float d = iq_d(type, blk);
#pragma GCC unroll 2
        for (int ib = 0; ib < 8; ib++) {
            __m256i u, sg;
            float sc[2];
            iq_sub(type, blk, ib, &u, &sg);
            iq_scales(type, blk, ib, d, sc);
            codes_bf16(_mm256_sign_epi8(u, sg), sc[0], sc[1], 0.f, 0.f, dst + 256 * sb + 32 * ib);
        }
    }
}

#define IQ_ROW_BF16(t) case t: iq_row_bf16(t, w, K, dst); return 1;
int ggml_iq_row_bf16(int type, const uint8_t *w, int K, uint16_t *dst) {
    switch (type) {
    IQ_ROW_BF16(GT_IQ2_XXS) IQ_ROW_BF16(GT_IQ2_XS) IQ_ROW_BF16(GT_IQ2_S) IQ_ROW_BF16(GT_IQ3_XXS)
    IQ_ROW_BF16(GT_IQ3_S) IQ_ROW_BF16(GT_IQ1_S) IQ_ROW_BF16(GT_IQ1_M)
    default: return 0;
    }
}

#else /* portable: the scalar decode, integer dots per 16 */

int ggml_iq_row_bf16(int type, const uint8_t *w, int K, uint16_t *dst) {
    float f[256];
    if (!ggml_iq_type(type)) return 0;
    for (int sb = 0; sb < K / 256; sb++) {
        ggml_iq_dequant_row(type, w + (int64_t)iq_block_bytes(type) * sb, 256, f);
        for (int i = 0; i < 256; i++) dst[256 * sb + i] = f32_to_bf16(f[i]);
    }
    return 1;
}


FORCE_INLINE void iq_grow(const int type, const uint8_t *w, int n, const int8_t *const *xq, const float *const *xd,
                          float *res, const int NT) {
    const int bs = iq_block_bytes(type);
    float acc[NTMAX] = {0};
    int8_t q[32];
    float sc[2];
    for (int sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = w + (int64_t)bs * sb;
        const float d = iq_d(type, blk);
        for (int ib = 0; ib < 8; ib++) {
            iq_codes(type, blk, ib, q);
            iq_scales(type, blk, ib, d, sc);
            const int b = 8 * sb + ib;
            for (int t = 0; t < NT; t++) {
                int32_t p0 = 0, p1 = 0;
                for (int i = 0; i < 16; i++) p0 += (int32_t)q[i] * xq[t][32 * b + i];
                for (int i = 16; i < 32; i++) p1 += (int32_t)q[i] * xq[t][32 * b + i];
                acc[t] += ((float)p0 * sc[0] + (float)p1 * sc[1]) * xd[t][b];
            }
        }
    }
    for (int t = 0; t < NT; t++) res[t] = acc[t];
}
#endif

#define IQ_NT(type)                                             \
    switch (nt) {                                               \
    case 1: iq_grow(type, w, n, xq, xd, res, 1); break;         \
    case 2: iq_grow(type, w, n, xq, xd, res, 2); break;         \
    case 3: iq_grow(type, w, n, xq, xd, res, 3); break;         \
    default: iq_grow(type, w, n, xq, xd, res, 4); break;        \
    }

/* res[t] = <row w of `type` (n elements), prepared x_t (ggml_prep's layout)> for t < nt.
 * Returns 0 (nothing written) when `type` is not an i-quant of this file. */
int ggml_iq_row(int type, const uint8_t *w, int n, const uint8_t *const *xp, int nt, float *res) {
    const int8_t *xq[NTMAX];
    const float *xd[NTMAX];
    for (int t = 0; t < nt; t++) { xq[t] = (const int8_t *)xp[t]; xd[t] = (const float *)(xp[t] + n); }
    switch (type) {
    case GT_IQ2_XXS: IQ_NT(GT_IQ2_XXS) return 1;
    case GT_IQ2_XS: IQ_NT(GT_IQ2_XS) return 1;
    case GT_IQ2_S: IQ_NT(GT_IQ2_S) return 1;
    case GT_IQ3_XXS: IQ_NT(GT_IQ3_XXS) return 1;
    case GT_IQ3_S: IQ_NT(GT_IQ3_S) return 1;
    case GT_IQ1_S: IQ_NT(GT_IQ1_S) return 1;
    case GT_IQ1_M: IQ_NT(GT_IQ1_M) return 1;
    default: return 0;
    }
}

/* One row of `type` with K elements -> fp32, the values gguf.quants.dequantize gives (one
 * product sc * code per weight, as the reference's). Returns 0 when `type` is not an i-quant. */
int ggml_iq_dequant_row(int type, const uint8_t *w, int K, float *out) {
    const int bs = iq_block_bytes(type);
    if (!bs) return 0;
    int8_t q[32];
    float sc[2];
    for (int sb = 0; sb < K / 256; sb++) {
        const uint8_t *blk = w + (int64_t)bs * sb;
        const float d = iq_d(type, blk);
        for (int ib = 0; ib < 8; ib++) {
            iq_codes(type, blk, ib, q);
            iq_scales(type, blk, ib, d, sc);
            float *o = out + 256 * sb + 32 * ib;
            for (int i = 0; i < 32; i++) o[i] = sc[i >> 4] * (float)q[i];
        }
    }
    return 1;
}
