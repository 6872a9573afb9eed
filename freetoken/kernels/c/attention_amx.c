/* Decode attention's scores and values on AMX bf16 tiles (TDPBF16PS) over a bf16 KV cache: one
 * work item of attention.c (rows of one sequence x one KV head x one chunk of keys).
 *
 * Why: each row of a verify paid its own fp32 FMAs (8 per score, 8 per value column): an extra
 * row cost ~0.22 ms a layer at 1600 keys, twice the fp32 floor, where a tile product does 512
 * multiply-adds a cycle. Here the rows of an item (its G query heads x its R verify rows) are the
 * rows of the A tiles, 16 per tile, and each block of 32 keys is re-laid once for all of them:
 * K transposed into the B tiles' pair layout (16 keys x 16 pairs of columns per tile), V's rows
 * interleaved in pairs (16 columns x 16 pairs of keys per tile).
 *
 * Accuracy: a tile multiplies bf16 by bf16 exactly into fp32 and sums in fp32. The queries and
 * the softmax numerators are fp32, so each is split into three bf16 parts by truncation, hi +
 * mid + lo, which is exact (8 + 8 + 8 significant bits); the cache is bf16 already. Each score
 * and value column is then a sum of exact products in fp32, as the FMA kernel's, within the
 * same float64 tolerance.
 *
 * Bits: every output element is one C element accumulated over the same steps (column chunks
 * and parts for the scores, blocks and parts for the values) whichever tile row it sits in, so a
 * row's bits do not depend on the other rows of the item. Keys past a row's count in a shared
 * block get a weight of exactly 0. Every decode row takes this path when it is on (plain steps
 * included), so a verify row keeps the bits of the decode step at its position. */
#include "ft_kernels.h"

int ft_att_amx;

/* Switch decode attention over bf16 caches to the AMX tiles (kernels/choices.py's choice); returns
 * 1 when on (0 where this build or the OS does not run AMX). */
int ft_set_att_amx(int on) {
    ft_att_amx = on && ft_amx_ready();
    return ft_att_amx;
}

#ifdef FT_AMX
#define AMX_VB 8    /* blocks of V re-laid at a time: the accumulators stay in tiles across them (a tile
                     * stored and loaded back at once waits for the store; per block that doubled the cost) */
typedef struct { uint16_t *qa, *kb, *pa, *vb; float *s, *o; } att_amx_ws;

static int64_t al64(int64_t b) { return (b + 63) & ~(int64_t)63; }

/* Bytes of one thread's scratch for items of up to R rows of G heads and `chunk` keys. */
int64_t att_amx_ws_bytes(int R, int G, int Dp, int64_t chunk) {
    const int64_t T16 = (R * G + 15) / 16 * 16;
    return al64(3 * T16 * Dp * 2) + al64(32 * (int64_t)Dp * 2) + al64(AMX_VB * 32 * (int64_t)Dp * 2)
           + al64(3 * T16 * chunk * 2) + al64(T16 * chunk * 4)
           + al64(T16 * Dp * 4) + 64;
}

static att_amx_ws att_amx_carve(void *ws, int R, int G, int Dp, int64_t chunk) {
    const int64_t T16 = (R * G + 15) / 16 * 16;
    uint8_t *p = (uint8_t *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    att_amx_ws w;
    w.qa = (uint16_t *)p; p += al64(3 * T16 * Dp * 2);
    w.kb = (uint16_t *)p; p += al64(32 * (int64_t)Dp * 2);
    w.vb = (uint16_t *)p; p += al64(AMX_VB * 32 * (int64_t)Dp * 2);
    w.pa = (uint16_t *)p; p += al64(3 * T16 * chunk * 2);
    w.s = (float *)p; p += al64(T16 * chunk * 4);
    w.o = (float *)p;
    return w;
}

/* 16 floats -> three bf16 parts whose sum is exactly v (truncations: hi keeps v's top 8
 * significant bits, mid the next 8 of the exact remainder, lo the rest). */
FORCE_INLINE void split3v(__m512 v, uint16_t *d0, uint16_t *d1, uint16_t *d2) {
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i hi = _mm512_and_si512(_mm512_castps_si512(v), top);
    const __m512 r1 = _mm512_sub_ps(v, _mm512_castsi512_ps(hi));
    const __m512i mid = _mm512_and_si512(_mm512_castps_si512(r1), top);
    const __m512i lo = _mm512_castps_si512(_mm512_sub_ps(r1, _mm512_castsi512_ps(mid)));
    _mm256_storeu_si256((__m256i *)d0, _mm512_cvtepi32_epi16(_mm512_srli_epi32(hi, 16)));
    _mm256_storeu_si256((__m256i *)d1, _mm512_cvtepi32_epi16(_mm512_srli_epi32(mid, 16)));
    _mm256_storeu_si256((__m256i *)d2, _mm512_cvtepi32_epi16(_mm512_srli_epi32(lo, 16)));
}

/* 32 floats (a, then b) -> three bf16 parts as split3v, 32 of each: the parts' top halves gathered
 * by one word permute per part (their low halves are 0) instead of two narrowing moves. */
FORCE_INLINE void split3x2(__m512 a, __m512 b, uint16_t *d0, uint16_t *d1, uint16_t *d2) {
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                         31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i ha = _mm512_and_si512(_mm512_castps_si512(a), top), hb = _mm512_and_si512(_mm512_castps_si512(b), top);
    const __m512 ra = _mm512_sub_ps(a, _mm512_castsi512_ps(ha)), rb = _mm512_sub_ps(b, _mm512_castsi512_ps(hb));
    const __m512i ma = _mm512_and_si512(_mm512_castps_si512(ra), top), mb = _mm512_and_si512(_mm512_castps_si512(rb), top);
    const __m512i la = _mm512_castps_si512(_mm512_sub_ps(ra, _mm512_castsi512_ps(ma)));
    const __m512i lb = _mm512_castps_si512(_mm512_sub_ps(rb, _mm512_castsi512_ps(mb)));
    _mm512_storeu_si512(d0, _mm512_permutex2var_epi16(ha, odd, hb));
    _mm512_storeu_si512(d1, _mm512_permutex2var_epi16(ma, odd, mb));
    _mm512_storeu_si512(d2, _mm512_permutex2var_epi16(la, odd, lb));
}

FORCE_INLINE __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

FORCE_INLINE __mmask32 cols_mask(int D, int c) { return D - c >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (D - c)) - 1); }

/* The nb (<= 32) K rows of a block -> B tiles kb [2 halves][Dp/32][16 pairs][16 keys x 2]. */
static void att_amx_kblock(const uint8_t *const *kr, int64_t nb, int D, int Dp, uint16_t *kb) {
    __m512i r[16];
    for (int kh = 0; kh < 2; kh++)
        for (int c = 0; c < Dp; c += 32) {
            const __mmask32 m = cols_mask(D, c);
            for (int i = 0; i < 16; i++)
                r[i] = kh * 16 + i < nb ? _mm512_maskz_loadu_epi16(m, (const uint16_t *)kr[kh * 16 + i] + c)
                                        : _mm512_setzero_si512();
            t16x16(r, kb + ((int64_t)kh * (Dp / 32) + c / 32) * 512);
        }
}

/* The nb V rows of a block -> B tiles vb [Dp/16][16 key pairs][16 columns x 2] (rows past nb 0). */
static void att_amx_vblock(const uint8_t *const *vr, int64_t nb, int D, int Dp, uint16_t *vb) {
    __m512i lo_i, hi_i;
    {
        uint16_t il[32], ih[32];
        for (int i = 0; i < 16; i++) { il[2 * i] = i; il[2 * i + 1] = 32 + i; ih[2 * i] = 16 + i; ih[2 * i + 1] = 48 + i; }
        lo_i = _mm512_loadu_si512(il);
        hi_i = _mm512_loadu_si512(ih);
    }
    for (int kp = 0; kp < 16; kp++)
        for (int c = 0; c < Dp; c += 32) {
            const __mmask32 m = cols_mask(D, c);
            const __m512i x0 = 2 * kp < nb ? _mm512_maskz_loadu_epi16(m, (const uint16_t *)vr[2 * kp] + c) : _mm512_setzero_si512();
            const __m512i x1 = 2 * kp + 1 < nb ? _mm512_maskz_loadu_epi16(m, (const uint16_t *)vr[2 * kp + 1] + c)
                                               : _mm512_setzero_si512();
            _mm512_storeu_si512(vb + ((int64_t)(c / 16) * 16 + kp) * 32, _mm512_permutex2var_epi16(x0, lo_i, x1));
            _mm512_storeu_si512(vb + ((int64_t)(c / 16 + 1) * 16 + kp) * 32, _mm512_permutex2var_epi16(x0, hi_i, x1));
        }
}

FORCE_INLINE void att_amx_prefetch(const uint8_t *base, int64_t row_bytes, int64_t head_off, const int64_t *slots,
                                   int64_t nb, int64_t bytes) {
    for (int64_t i = 0; i < nb; i++) {
        const char *r = (const char *)(base + slots[i] * row_bytes + head_off);
        for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(r + o, 0, 2);
    }
}

/* Scores of column tiles t0 .. t0 + NT - 1 against the NK key halves of the block in kb, into s
 * (row stride chunk): NT x NK C tiles (0..3) accumulate at once, so consecutive tile products
 * of one C tile are NT x NK products apart (a product's latency is ~3 issues of another). */
FORCE_INLINE void scores_group(const att_amx_ws *w, int T16, int Dp, int t0, int64_t b, int64_t chunk, const int NT,
                               const int NK) {
    const int nc = Dp / 32;
    const int64_t part = (int64_t)T16 * Dp;
    _tile_zero(0);
    if (NK > 1) _tile_zero(1);
    if (NT > 1) _tile_zero(2);
    if (NT > 1 && NK > 1) _tile_zero(3);
    for (int p = 2; p >= 0; p--)        /* the small parts first: they add to a small sum */
        for (int c = 0; c < nc; c++) {
            _tile_loadd(4, w->kb + (int64_t)c * 512, 64);
            if (NK > 1) _tile_loadd(5, w->kb + ((int64_t)nc + c) * 512, 64);
            const uint16_t *a = w->qa + p * part + (int64_t)16 * t0 * Dp + 32 * c;
            _tile_loadd(6, a, Dp * 2);
            _tile_dpbf16ps(0, 6, 4);
            if (NK > 1) _tile_dpbf16ps(1, 6, 5);
            if (NT > 1) {
                _tile_loadd(7, a + (int64_t)16 * Dp, Dp * 2);
                _tile_dpbf16ps(2, 7, 4);
                if (NK > 1) _tile_dpbf16ps(3, 7, 5);
            }
        }
    float *o = w->s + (int64_t)16 * t0 * chunk + b;
    _tile_stored(0, o, chunk * 4);
    if (NK > 1) _tile_stored(1, o + 16, chunk * 4);
    if (NT > 1) _tile_stored(2, o + 16 * chunk, chunk * 4);
    if (NT > 1 && NK > 1) _tile_stored(3, o + 16 * chunk + 16, chunk * 4);
}

/* Scores of every tile row against the block in kb (nb keys) into s (row stride chunk). */
static void att_amx_scores(const att_amx_ws *w, int T16, int Dp, int64_t nb, int64_t b, int64_t chunk) {
    const int nt = T16 / 16;
    for (int t = 0; t < nt; t += 2) {
        if (t + 1 < nt) {
            if (nb > 16) scores_group(w, T16, Dp, t, b, chunk, 2, 2);
            else scores_group(w, T16, Dp, t, b, chunk, 2, 1);
        } else {
            if (nb > 16) scores_group(w, T16, Dp, t, b, chunk, 1, 2);
            else scores_group(w, T16, Dp, t, b, chunk, 1, 1);
        }
    }
}

/* Softmax numerators of one tile row's first n scores (scaled here): m = max (NaNs skipped),
 * l = sum of e = exp(scale * s - m); e goes out as its three bf16 parts at pa (part stride ps),
 * zeros after it up to n32 keys (a shared block's keys past this row's weigh exactly 0). */
static void att_amx_softmax(float *s, int64_t n, int64_t n32, float scale, uint16_t *pa, int64_t ps, float *m,
                            float *l) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes(n - i);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + i), sc);
        _mm512_mask_storeu_ps(s + i, k, x);
        mx = _mm512_mask_max_ps(mx, k, x, mx);
    }
    const float mm = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(mm);
    for (int64_t i = 0; i < n32; i += 32) {
        const __mmask16 k0 = lanes(n - i), k1 = lanes(n - i - 16);
        const __m512 e0 = _mm512_maskz_mov_ps(k0, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k0, s + i), mv)));
        const __m512 e1 = _mm512_maskz_mov_ps(k1, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1, s + i + 16), mv)));
        split3x2(e0, e1, pa + i, pa + ps + i, pa + 2 * ps + i);
        sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
    }
    *m = mm;
    *l = _mm512_reduce_add_ps(sum);
}

/* Column slices j0 .. j0 + NJ - 1 of column tile t: C tiles 0..NJ-1 loaded from o, += for each
 * of the nblk blocks in vb/pa the three parts of its weights (A, tile 6) x the slices of its V
 * rows (B, tiles 4/5), stored back. */
FORCE_INLINE void values_group(const att_amx_ws *w, int T16, int Dp, int t, int j0, int64_t b0, int nblk,
                               int64_t chunk, const int NJ) {
    float *c = w->o + (int64_t)16 * t * Dp + 16 * j0;
    _tile_loadd(0, c, Dp * 4);
    _tile_loadd(1, c + 16, Dp * 4);
    if (NJ > 2) { _tile_loadd(2, c + 32, Dp * 4); _tile_loadd(3, c + 48, Dp * 4); }
    for (int i = 0; i < nblk; i++) {
        const uint16_t *vb = w->vb + (int64_t)i * 32 * Dp + (int64_t)j0 * 512;
        const uint16_t *a = w->pa + (int64_t)16 * t * chunk + b0 + 32 * i;
        const int64_t pt = (int64_t)T16 * chunk;
#define VG_PART(AT, P)                                                              \
        _tile_loadd(AT, a + (P) * pt, chunk * 2);                                   \
        _tile_loadd(4, vb, 64);                                                     \
        _tile_dpbf16ps(0, AT, 4);                                                   \
        _tile_loadd(5, vb + 512, 64);                                               \
        _tile_dpbf16ps(1, AT, 5);                                                   \
        if (NJ > 2) {                                                               \
            _tile_loadd(4, vb + 1024, 64);                                          \
            _tile_dpbf16ps(2, AT, 4);                                               \
            _tile_loadd(5, vb + 1536, 64);                                          \
            _tile_dpbf16ps(3, AT, 5);                                               \
        }
        VG_PART(6, 0)
        VG_PART(7, 1)
        VG_PART(6, 2)
#undef VG_PART
    }
    _tile_stored(0, c, Dp * 4);
    _tile_stored(1, c + 16, Dp * 4);
    if (NJ > 2) { _tile_stored(2, c + 32, Dp * 4); _tile_stored(3, c + 48, Dp * 4); }
}

/* The values of keys [b0, b0 + 32 nblk) into the accumulators o: V's blocks re-laid, then each
 * C tile accumulates over those blocks in turn (the weights' parts from the softmax). */
static void att_amx_values(const att_amx_ws *w, const uint8_t *v, int64_t row_bytes, int64_t head_off,
                           const int64_t *slots, int T16, int D, int Dp, int64_t n, int64_t b0, int64_t chunk) {
    const uint8_t *rows[32];
    int nblk = 0;
    for (int64_t b = b0; b < n && nblk < AMX_VB; b += 32, nblk++) {
        const int64_t nb = n - b < 32 ? n - b : 32, b2 = b + 32;
        if (b2 < n) att_amx_prefetch(v, row_bytes, head_off, slots + b2, n - b2 < 32 ? n - b2 : 32, D * 2);
        for (int64_t i = 0; i < nb; i++) rows[i] = v + slots[b + i] * row_bytes + head_off;
        att_amx_vblock(rows, nb, D, Dp, w->vb + (int64_t)nblk * 32 * Dp);
    }
    for (int t = 0; t < T16 / 16; t++)
        for (int j = 0; j < Dp / 16; j += 4) {
            if (Dp / 16 - j >= 4) values_group(w, T16, Dp, t, j, b0, nblk, chunk, 4);
            else values_group(w, T16, Dp, t, j, b0, nblk, chunk, 2);      /* Dp is a multiple of 32: 2 slices left */
        }
}

/* One item: rows r < R of one sequence (row r's queries at q + r * q_rs, head g at + g * D; its
 * first nr[r] of the n keys through slots), one KV head (K/V rows at base + slot * row_bytes +
 * head_off). Returns the unnormalized outputs [R * G][Dp] in column order; ml[r * 2G + g] the max,
 * ml[r * 2G + G + g] the sum of row r's head g. The caller has configured the tiles. */
float *att_amx_item(const float *q, int64_t q_rs, int R, int G, int D, int Dp, const uint8_t *k, const uint8_t *v,
                    int64_t row_bytes, int64_t head_off, const int64_t *slots, const int64_t *nr, int64_t n,
                    int64_t chunk, float scale, void *ws, float *ml) {
    const int T16 = (R * G + 15) / 16 * 16;
    const att_amx_ws w = att_amx_carve(ws, R, G, Dp, chunk);
    for (int u = 0; u < T16; u++)
        for (int c = 0; c < Dp; c += 16) {
            uint16_t *d = w.qa + (int64_t)u * Dp + c;
            split3v(_mm512_maskz_loadu_ps(lanes(u < R * G ? D - c : 0), q + (u / G) * q_rs + (int64_t)(u % G) * D + c),
                    d, d + (int64_t)T16 * Dp, d + (int64_t)2 * T16 * Dp);
        }
    const uint8_t *rows[32];
    for (int64_t b = 0; b < n; b += 32) {
        const int64_t nb = n - b < 32 ? n - b : 32, b2 = b + 32;
        if (b2 < n) att_amx_prefetch(k, row_bytes, head_off, slots + b2, n - b2 < 32 ? n - b2 : 32, D * 2);
        else att_amx_prefetch(v, row_bytes, head_off, slots, n < 32 ? n : 32, D * 2);
        for (int64_t i = 0; i < nb; i++) rows[i] = k + slots[b + i] * row_bytes + head_off;
        att_amx_kblock(rows, nb, D, Dp, w.kb);
        att_amx_scores(&w, T16, Dp, nb, b, chunk);
    }
    const int64_t n32 = (n + 31) & ~(int64_t)31, ps = (int64_t)T16 * chunk;
    for (int u = 0; u < T16; u++) {
        const int r = u / G, g = u % G;
        uint16_t *pa = w.pa + (int64_t)u * chunk;
        if (u < R * G && nr[r]) att_amx_softmax(w.s + (int64_t)u * chunk, nr[r], n32, scale, pa, ps, ml + r * 2 * G + g,
                                                ml + r * 2 * G + G + g);
        else for (int p = 0; p < 3; p++) memset(pa + p * ps, 0, (size_t)n32 * 2);
    }
    memset(w.o, 0, (size_t)T16 * Dp * 4);
    for (int64_t b0 = 0; b0 < n; b0 += 32 * AMX_VB)
        att_amx_values(&w, v, row_bytes, head_off, slots, T16, D, Dp, n, b0, chunk);
    return w.o;
}
#endif
