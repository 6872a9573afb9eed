/* The inner loops of decode attention (attention.c): one block of keys of one (sequence, KV
 * head) against the G query heads that share it.
 *
 * Scores go to sc in [key][head] order. A tile is one vector of (key, head) pairs: W/G keys x
 * the G heads (W = 16 lanes with AVX-512, 8 with AVX2, when G divides W), each chunk of a key
 * row loaded once for the G heads; its W dot-product accumulators are reduced into one vector
 * by a transpose-and-add tree (~3 uops per score; a horizontal sum per score cost ~5) and
 * stored contiguously. Other G: tiles of W consecutive pairs.
 *
 * Values: a slice of 32 (AVX-512) or 16 (AVX2) columns of a V row is loaded once, widened in
 * registers (bf16 pairs split into even and odd columns by a shift and a mask: no shuffle, no
 * buffer) and used by up to 8 (4) heads whose accumulators stay in registers for the whole
 * block. The accumulators are in that even/odd order (att_col maps a position to its column).
 *
 * Tried and dropped: q rounded to bf16 and the scores as vdpbf16ps straight on the bf16 rows.
 * On the Sapphire Rapids vCPUs measured, a zmm vdpbf16ps issued at about a quarter of the rate
 * of a zmm FMA (half the multiply-adds per second), so it was no faster than fp32 FMAs over a
 * block widened once for the whole group, and it rounds the queries. */
#include "ft_kernels.h"

#ifdef FT_AVX2
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
/* 8 accumulators -> one vector of their 8 sums, in order. */
FORCE_INLINE __m256 reduce8(const __m256 *a) {
    __m256 b[4], c[2];
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(b[2 * i]), _mm256_castps_pd(b[2 * i + 1]))),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(b[2 * i]), _mm256_castps_pd(b[2 * i + 1]))));
    return _mm256_add_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20), _mm256_permute2f128_ps(c[0], c[1], 0x31));
}
#endif

#ifdef FT_AVX512
/* 16 accumulators -> one vector of their 16 sums, in order (45 uops). */
FORCE_INLINE __m512 reduce16(const __m512 *a) {
    __m512 b[8], c[4], f[2];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))));
    for (int i = 0; i < 2; i++)
        f[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

/* Column of accumulator position pos (see att_values_block). */
int att_col(int kvt, int G, int pos) {
#ifdef FT_BF16DOT
    if (kvt == ATT_KV_BF16P && G <= 16) {   /* vtile_bf16: 32-bit lane j of the unpacked key pairs */
        int b = pos & ~31, i = pos & 31, j = i & 15;
        return b + 8 * (j >> 2) + (i >= 16 ? 4 : 0) + (j & 3);
    }
#endif
    (void)G;
    if (kvt == ATT_KV_BF16P) kvt = XT_BF16;
#if defined(FT_AVX512)
    if (kvt == XT_BF16) { int b = pos & ~31, i = pos & 31; return b + (i < 16 ? 2 * i : 2 * (i - 16) + 1); }
#elif defined(FT_AVX2)
    if (kvt == XT_BF16) { int b = pos & ~15, i = pos & 15; return b + (i < 8 ? 2 * i : 2 * (i - 8) + 1); }
#endif
    (void)kvt;
    return pos;
}

/* The G query heads of an item, zero padded to Dp columns, with one zero row after them (for
 * the unused pairs of a last tile): fp32 as they are (ATT_Q_F32), rounded to bf16 but kept as
 * fp32 (ATT_Q_ROUNDED: the fp32 tiles then compute the products of vdpbf16ps), or as bf16
 * values (ATT_Q_BF16, for att_scores_block_bf16). */
void att_prep_q(const float *q, int G, int D, int Dp, float *qf, int mode) {
    memset(qf, 0, (size_t)(G + 1) * Dp * 4);
    for (int g = 0; g < G; g++) {
        const float *src = q + (int64_t)g * D;
        if (mode == ATT_Q_F32) memcpy(qf + (int64_t)g * Dp, src, (size_t)D * 4);
        else if (mode == ATT_Q_ROUNDED)
            for (int c = 0; c < D; c++) qf[(int64_t)g * Dp + c] = bf16_to_f32(f32_to_bf16(src[c]));
        else
            for (int c = 0; c < D; c++) ((uint16_t *)qf)[(int64_t)g * Dp + c] = f32_to_bf16(src[c]);
    }
}

/* Score tiles of one vector of (key, head) pairs when G divides the width: W/GG keys x all GG
 * heads, each chunk of a key row loaded once for its GG heads (the query chunks stay in
 * registers across the keys). Unused keys of a last tile repeat key 0 and are not stored. */
#if defined(FT_AVX512)
FORCE_INLINE __m512 gtile_f32(const float *const *kp, const float *qf, int Dp, const int GG) {
    __m512 a[16];
    for (int u = 0; u < 16; u++) a[u] = _mm512_setzero_ps();
    for (int c = 0; c < Dp; c += 16)
        for (int kk = 0; kk < 16 / GG; kk++) {
            const __m512 k = _mm512_loadu_ps(kp[kk] + c);
            for (int h = 0; h < GG; h++) a[kk * GG + h] = _mm512_fmadd_ps(k, _mm512_loadu_ps(qf + h * Dp + c), a[kk * GG + h]);
        }
    return reduce16(a);
}
#define GT_W 16
#elif defined(FT_AVX2)
FORCE_INLINE __m256 gtile_f32(const float *const *kp, const float *qf, int Dp, const int GG) {
    __m256 a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
    for (int c = 0; c < Dp; c += 8)
        for (int kk = 0; kk < 8 / GG; kk++) {
            const __m256 k = _mm256_loadu_ps(kp[kk] + c);
            for (int h = 0; h < GG; h++) a[kk * GG + h] = _mm256_fmadd_ps(k, _mm256_loadu_ps(qf + h * Dp + c), a[kk * GG + h]);
        }
    return reduce8(a);
}
#define GT_W 8
#endif

#ifdef GT_W
/* All nb keys of a block in tiles of GT_W/GG keys (G == GG divides GT_W); bf16 on kb if set. */
FORCE_INLINE void gtiles(const float *const *rows, int64_t nb, int Dp, const float *qf, float scale, float *sc,
                         const int GG) {
    const int NK = GT_W / GG;
    for (int64_t j = 0; j < nb; j += NK) {
        const int keys = nb - j < NK ? (int)(nb - j) : NK;
        const int64_t cnt = (int64_t)keys * GG;
        const float *kp[GT_W];
        for (int kk = 0; kk < NK; kk++) kp[kk] = rows[j + (kk < keys ? kk : 0)];
#if GT_W == 16
        _mm512_mask_storeu_ps(sc + j * GG, (__mmask16)((1u << cnt) - 1),
                              _mm512_mul_ps(gtile_f32(kp, qf, Dp, GG), _mm512_set1_ps(scale)));
#else
        float r[8];
        _mm256_storeu_ps(r, _mm256_mul_ps(gtile_f32(kp, qf, Dp, GG), _mm256_set1_ps(scale)));
        memcpy(sc + j * GG, r, (size_t)cnt * 4);
#endif
    }
}
#endif

#ifdef FT_BF16DOT
/* gtile_f32 on the bf16 key rows as they lie in the cache, with bf16 queries: 32 columns per
 * vdpbf16ps (twice the multiply-adds of an fp32 FMA per instruction, and no widening of the
 * rows); the last partial slice through a masked load (the queries are zero padded). */
FORCE_INLINE __m512 gtile_bf16(const uint16_t *const *kp, const uint16_t *qb, int D, int Dp, const int GG) {
    __m512 a[16];
    for (int u = 0; u < 16; u++) a[u] = _mm512_setzero_ps();
    for (int c = 0; c < Dp; c += 32) {
        const __mmask32 m = D - c >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (D - c)) - 1);
        for (int kk = 0; kk < 16 / GG; kk++) {
            const __m512bh k = (__m512bh)_mm512_maskz_loadu_epi16(m, kp[kk] + c);
            for (int h = 0; h < GG; h++)
                a[kk * GG + h] = _mm512_dpbf16_ps(a[kk * GG + h], k, (__m512bh)_mm512_loadu_si512(qb + h * Dp + c));
        }
    }
    return reduce16(a);
}

FORCE_INLINE void gtiles_bf16(const uint16_t *const *rows, int64_t nb, int D, int Dp, const uint16_t *qb,
                              float scale, float *sc, const int GG) {
    const int NK = 16 / GG;
    for (int64_t j = 0; j < nb; j += NK) {
        const int keys = nb - j < NK ? (int)(nb - j) : NK;
        const uint16_t *kp[16];
        for (int kk = 0; kk < NK; kk++) kp[kk] = rows[j + (kk < keys ? kk : 0)];
        _mm512_mask_storeu_ps(sc + j * GG, (__mmask16)((1u << (keys * GG)) - 1),
                              _mm512_mul_ps(gtile_bf16(kp, qb, D, Dp, GG), _mm512_set1_ps(scale)));
    }
}

/* att_scores_block with bf16 queries qb [G+1][Dp] on bf16 rows read in place (G divides 16). */
void att_scores_block_bf16(const uint16_t *const *rows, int64_t nb, int G, int D, int Dp, const uint16_t *qb,
                           float scale, float *sc) {
    switch (G) {
    case 1: gtiles_bf16(rows, nb, D, Dp, qb, scale, sc, 1); break;
    case 2: gtiles_bf16(rows, nb, D, Dp, qb, scale, sc, 2); break;
    case 4: gtiles_bf16(rows, nb, D, Dp, qb, scale, sc, 4); break;
    case 8: gtiles_bf16(rows, nb, D, Dp, qb, scale, sc, 8); break;
    default: gtiles_bf16(rows, nb, D, Dp, qb, scale, sc, 16); break;
    }
}
#endif

/* sc[i * G + g] = scale * <q_g, row i> for the nb rows of a block (fp32 [Dp], zero padded). */
void att_scores_block(const float *const *rows, int64_t nb, int G, int D, int Dp, const float *qf, float scale,
                      float *sc) {
    const int64_t pairs = nb * G;
    int64_t t = 0, j = 0;
    int g = 0;
    (void)j; (void)g;
#ifdef GT_W
    switch (G) {
    case 1: gtiles(rows, nb, Dp, qf, scale, sc, 1); return;
    case 2: gtiles(rows, nb, Dp, qf, scale, sc, 2); return;
    case 4: gtiles(rows, nb, Dp, qf, scale, sc, 4); return;
    case 8: gtiles(rows, nb, Dp, qf, scale, sc, 8); return;
#if GT_W == 16
    case 16: gtiles(rows, nb, Dp, qf, scale, sc, 16); return;
#endif
    }
#endif
#if defined(FT_AVX512)
    for (; t < pairs; t += 16) {
        const int cnt = pairs - t < 16 ? (int)(pairs - t) : 16;
        const float *kp[16], *qp[16];
        for (int u = 0; u < 16; u++) {      /* pair t + u: key j, head g (no divisions) */
            kp[u] = rows[u < cnt ? j : 0];
            qp[u] = qf + (int64_t)(u < cnt ? g : G) * Dp;
            if (++g == G) { g = 0; j++; }
        }
        __m512 a[16];
        for (int u = 0; u < 16; u++) a[u] = _mm512_setzero_ps();
        for (int c = 0; c < Dp; c += 16)
            for (int u = 0; u < 16; u++) a[u] = _mm512_fmadd_ps(_mm512_loadu_ps(kp[u] + c), _mm512_loadu_ps(qp[u] + c), a[u]);
        _mm512_mask_storeu_ps(sc + t, (__mmask16)((1u << cnt) - 1), _mm512_mul_ps(reduce16(a), _mm512_set1_ps(scale)));
    }
#elif defined(FT_AVX2)
    for (; t < pairs; t += 8) {
        const int cnt = pairs - t < 8 ? (int)(pairs - t) : 8;
        const float *kp[8], *qp[8];
        for (int u = 0; u < 8; u++) {      /* pair t + u: key j, head g (no divisions) */
            kp[u] = rows[u < cnt ? j : 0];
            qp[u] = qf + (int64_t)(u < cnt ? g : G) * Dp;
            if (++g == G) { g = 0; j++; }
        }
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
        for (int c = 0; c < Dp; c += 8)
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(_mm256_loadu_ps(kp[u] + c), _mm256_loadu_ps(qp[u] + c), a[u]);
        float r[8];
        _mm256_storeu_ps(r, _mm256_mul_ps(reduce8(a), _mm256_set1_ps(scale)));
        memcpy(sc + t, r, (size_t)cnt * 4);
    }
#endif
    for (; t < pairs; t++) {
        const float *k = rows[t / G], *qv = qf + (t % G) * Dp;
        float acc = 0.f;
        for (int c = 0; c < D; c++) acc += qv[c] * k[c];
        sc[t] = acc * scale;
    }
}

/* Softmax numerators in place over sc [n][G]: m[g] = max_i sc[i*G+g] (NaNs skipped), sc =
 * exp(sc - m), l[g] = their sum. Vector lanes keep one head each when G divides the width. */
void att_softmax(float *sc, int64_t n, int G, float *m, float *l) {
    const int64_t total = n * G;
    int64_t t = 0;
    for (int g = 0; g < G; g++) { m[g] = -INFINITY; l[g] = 0.f; }
#if defined(FT_AVX512)
    if (16 % G == 0 && total >= 16) {
        __m512 mx = _mm512_set1_ps(-INFINITY), s = _mm512_setzero_ps();
        const int64_t full = total & ~(int64_t)15;
        for (t = 0; t < full; t += 16) mx = _mm512_max_ps(_mm512_loadu_ps(sc + t), mx);   /* mx where NaN */
        float lane[16];
        _mm512_storeu_ps(lane, mx);
        for (int u = 0; u < 16; u++) m[u % G] = lane[u] > m[u % G] ? lane[u] : m[u % G];
        for (int64_t r = full; r < total; r++) m[r % G] = sc[r] > m[r % G] ? sc[r] : m[r % G];
        for (int u = 0; u < 16; u++) lane[u] = m[u % G];
        mx = _mm512_loadu_ps(lane);
        for (t = 0; t < full; t += 16) {
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + t), mx));
            _mm512_storeu_ps(sc + t, e);
            s = _mm512_add_ps(s, e);
        }
        _mm512_storeu_ps(lane, s);
        for (int u = 0; u < 16; u++) l[u % G] += lane[u];
    }
#elif defined(FT_AVX2)
    if (8 % G == 0 && total >= 8) {
        __m256 mx = _mm256_set1_ps(-INFINITY), s = _mm256_setzero_ps();
        const int64_t full = total & ~(int64_t)7;
        for (t = 0; t < full; t += 8) mx = _mm256_max_ps(_mm256_loadu_ps(sc + t), mx);
        float lane[8];
        _mm256_storeu_ps(lane, mx);
        for (int u = 0; u < 8; u++) m[u % G] = lane[u] > m[u % G] ? lane[u] : m[u % G];
        for (int64_t r = full; r < total; r++) m[r % G] = sc[r] > m[r % G] ? sc[r] : m[r % G];
        for (int u = 0; u < 8; u++) lane[u] = m[u % G];
        mx = _mm256_loadu_ps(lane);
        for (t = 0; t < full; t += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + t), mx));
            _mm256_storeu_ps(sc + t, e);
            s = _mm256_add_ps(s, e);
        }
        _mm256_storeu_ps(lane, s);
        for (int u = 0; u < 8; u++) l[u % G] += lane[u];
    }
#endif
    if (t == 0)
        for (int64_t r = 0; r < total; r++) m[r % G] = sc[r] > m[r % G] ? sc[r] : m[r % G];
    for (int64_t r = t; r < total; r++) { sc[r] = expf(sc[r] - m[r % G]); l[r % G] += sc[r]; }
}

#ifdef FT_AVX512
/* The value tiles' register accumulators: heads g0.. g0+GH-1, 32 columns from c0 (store: 1). */
FORCE_INLINE void acc_io(float *acc, int Dp, int c0, int g0, __m512 (*a)[2], const int GH, const int store) {
    for (int u = 0; u < GH; u++) {
        float *r = acc + (int64_t)(g0 + u) * Dp + c0;
        if (store) { _mm512_storeu_ps(r, a[u][0]); _mm512_storeu_ps(r + 16, a[u][1]); }
        else { a[u][0] = _mm512_loadu_ps(r); a[u][1] = _mm512_loadu_ps(r + 16); }
    }
}

/* GH heads' accumulators over 32 columns from c0 (even then odd columns for bf16) in registers
 * for all nb rows: one load and two widening ops per row serve 2*GH FMAs. */
FORCE_INLINE void vtile512(const uint8_t *const *vr, int kvt, const float *p, int64_t nb, int G, int D, int Dp,
                           int c0, int g0, float *acc, const int GH) {
    __m512 a[8][2];
    acc_io(acc, Dp, c0, g0, a, GH, 0);
    const int w = D - c0 < 32 ? D - c0 : 32;
    const __mmask32 m = w == 32 ? ~(__mmask32)0 : (__mmask32)((1u << w) - 1);
    const __mmask16 m0 = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1), m1 = (__mmask16)(w >= 32 ? 0xffff : w > 16 ? (1u << (w - 16)) - 1 : 0);
    for (int64_t i = 0; i < nb; i++) {
        __m512 ev, od;
        if (kvt == XT_BF16) {
            const __m512i x = _mm512_maskz_loadu_epi16(m, (const uint16_t *)vr[i] + c0);
            ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            od = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
        } else {
            ev = _mm512_maskz_loadu_ps(m0, (const float *)vr[i] + c0);
            od = _mm512_maskz_loadu_ps(m1, (const float *)vr[i] + c0 + 16);
        }
        const float *pi = p + i * G + g0;
        for (int u = 0; u < GH; u++) {
            const __m512 wu = _mm512_set1_ps(pi[u]);
            a[u][0] = _mm512_fmadd_ps(wu, ev, a[u][0]);
            a[u][1] = _mm512_fmadd_ps(wu, od, a[u][1]);
        }
    }
    acc_io(acc, Dp, c0, g0, a, GH, 1);
}
#define VT_WIDTH 32
#define VT_HEADS 8
#define VTILE(GH) vtile512(vr, kvt, p, nb, G, D, Dp, c0, g0, acc, GH)
#elif defined(FT_AVX2)
/* vtile512 on 16 columns and up to 4 heads (16 registers); a partial last slice is copied to a
 * zero-padded row first (no 16-bit masked loads before AVX-512). */
FORCE_INLINE void vtile256(const uint8_t *const *vr, int kvt, const float *p, int64_t nb, int G, int D, int Dp,
                           int c0, int g0, float *acc, const int GH) {
    __m256 a[4][2];
    for (int u = 0; u < GH; u++) {
        a[u][0] = _mm256_loadu_ps(acc + (int64_t)(g0 + u) * Dp + c0);
        a[u][1] = _mm256_loadu_ps(acc + (int64_t)(g0 + u) * Dp + c0 + 8);
    }
    const int w = D - c0 < 16 ? D - c0 : 16, es = kvt == XT_BF16 ? 2 : 4;
    float pad[16];
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *r = vr[i] + (int64_t)c0 * es;
        if (w < 16) { memset(pad, 0, sizeof pad); memcpy(pad, r, (size_t)w * es); r = (const uint8_t *)pad; }
        __m256 ev, od;
        if (kvt == XT_BF16) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)r);
            ev = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
            od = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
        } else {
            ev = _mm256_loadu_ps((const float *)r);
            od = _mm256_loadu_ps((const float *)r + 8);
        }
        const float *pi = p + i * G + g0;
        for (int u = 0; u < GH; u++) {
            const __m256 wu = _mm256_set1_ps(pi[u]);
            a[u][0] = _mm256_fmadd_ps(wu, ev, a[u][0]);
            a[u][1] = _mm256_fmadd_ps(wu, od, a[u][1]);
        }
    }
    for (int u = 0; u < GH; u++) {
        _mm256_storeu_ps(acc + (int64_t)(g0 + u) * Dp + c0, a[u][0]);
        _mm256_storeu_ps(acc + (int64_t)(g0 + u) * Dp + c0 + 8, a[u][1]);
    }
}
#define VT_WIDTH 16
#define VT_HEADS 4
#define VTILE(GH) vtile256(vr, kvt, p, nb, G, D, Dp, c0, g0, acc, GH)
#endif

#ifdef FT_BF16DOT
/* vtile512 for ATT_KV_BF16P: two keys at a time, their rows' 32-column slices interleaved per
 * column (unpacklo/hi: lane j of lo holds the pair of column 8(j/4) + j%4, of hi that + 4) and
 * one vdpbf16ps per half with the pair of bf16 weights pp[i/2][g]: half the instructions of the
 * fp32 FMAs, and no widening. */
FORCE_INLINE void vtile_bf16(const uint8_t *const *vr, const uint32_t *pp, int64_t nb, int G, int D, int Dp,
                             int c0, int g0, float *acc, const int GH) {
    __m512 a[8][2];
    acc_io(acc, Dp, c0, g0, a, GH, 0);
    const int w = D - c0 < 32 ? D - c0 : 32;
    const __mmask32 m = w == 32 ? ~(__mmask32)0 : (__mmask32)((1u << w) - 1);
    for (int64_t i = 0; i < nb; i += 2) {
        const __m512i x0 = _mm512_maskz_loadu_epi16(m, (const uint16_t *)vr[i] + c0);
        const __m512i x1 = i + 1 < nb ? _mm512_maskz_loadu_epi16(m, (const uint16_t *)vr[i + 1] + c0)
                                      : _mm512_setzero_si512();
        const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(x0, x1), hi = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
        const uint32_t *pi = pp + (i / 2) * G + g0;
        for (int u = 0; u < GH; u++) {
            const __m512bh wu = (__m512bh)_mm512_set1_epi32((int)pi[u]);
            a[u][0] = _mm512_dpbf16_ps(a[u][0], lo, wu);
            a[u][1] = _mm512_dpbf16_ps(a[u][1], hi, wu);
        }
    }
    acc_io(acc, Dp, c0, g0, a, GH, 1);
}
#define VTILE_BF16(GH) vtile_bf16(vr, pp, nb, G, D, Dp, c0, g0, acc, GH)
#endif

/* acc[g][pos] += sum_i p[i*G+g] * V_i[att_col(kvt, G, pos)] over the nb (<= 32) rows vr of a
 * block (bf16 or fp32 cache rows, read in place); acc [G][Dp]. ATT_KV_BF16P: bf16 rows and p
 * rounded to bf16 (vdpbf16ps, or emulated: p rounded in place, then the fp32 tiles). */
void att_values_block(const uint8_t *const *vr, int kvt, float *p, int64_t nb, int G, int D, int Dp, float *acc) {
    if (kvt == ATT_KV_BF16P) {
#ifdef FT_BF16DOT
        if (G <= 16) {
            uint32_t pp[16 * 16];
            for (int64_t i = 0; i < nb; i += 2)
                for (int g = 0; g < G; g++)
                    pp[(i / 2) * G + g] = f32_to_bf16(p[i * G + g])
                                          | (uint32_t)(i + 1 < nb ? f32_to_bf16(p[(i + 1) * G + g]) : 0) << 16;
            for (int c0 = 0; c0 < D; c0 += 32)
                for (int g0 = 0; g0 < G; g0 += 8) {
                    switch (G - g0 < 8 ? G - g0 : 8) {
                    case 1: VTILE_BF16(1); break;
                    case 2: VTILE_BF16(2); break;
                    case 3: VTILE_BF16(3); break;
                    case 4: VTILE_BF16(4); break;
                    case 5: VTILE_BF16(5); break;
                    case 6: VTILE_BF16(6); break;
                    case 7: VTILE_BF16(7); break;
                    default: VTILE_BF16(8); break;
                    }
                }
            return;
        }
#endif
        for (int64_t i = 0; i < nb * G; i++) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
        kvt = XT_BF16;
    }
#ifdef VT_WIDTH
    for (int c0 = 0; c0 < D; c0 += VT_WIDTH)
        for (int g0 = 0; g0 < G; g0 += VT_HEADS) {
            switch (G - g0 < VT_HEADS ? G - g0 : VT_HEADS) {
            case 1: VTILE(1); break;
            case 2: VTILE(2); break;
            case 3: VTILE(3); break;
            case 4: VTILE(4); break;
#if VT_HEADS > 4
            case 5: VTILE(5); break;
            case 6: VTILE(6); break;
            case 7: VTILE(7); break;
            default: VTILE(8); break;
#endif
            }
        }
#else
    for (int64_t i = 0; i < nb; i++)
        for (int g = 0; g < G; g++) {
            const float w = p[i * G + g];
            float *o = acc + (int64_t)g * Dp;
            for (int c = 0; c < D; c++) o[c] += w * float_at(kvt == XT_BF16 ? FMT_BF16 : FMT_F32, vr[i], c);
        }
#endif
}

void att_values_rows(const uint8_t *const *vr, int kvt, int64_t nb, int64_t b, const int64_t *nr, int R, int G,
                     int D, int Dp, float *p, int64_t stride, float *acc) {
    for (int r = 0; r < R; r++)
        if (nr[r] > b)
            att_values_block(vr, kvt, p + r * stride, nr[r] - b < nb ? nr[r] - b : nb, G, D, Dp, acc + r * stride);
}
