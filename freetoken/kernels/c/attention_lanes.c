/* Decode attention's scores with the queries in the vector lanes (attention.c's ATT_Q_LANES: a
 * bf16 cache under ft_bf16_dot_on, G = 8 or 16 query heads a KV head, an even head_dim).
 *
 * A verify's R rows x G heads of one KV head are one set of R*G queries: transposed once an item
 * into [D/2][lanes] bf16 pairs, and each key's pair at column 2p broadcast from the cache row (an
 * embedded-broadcast operand of vdpbf16ps) against 16 queries' pairs at once. A key block is then
 * read once for all the rows' multiply-adds, no reduction tree (attention_blocks.c's gtile_bf16
 * spends ~45 shuffles and adds on every 16 scores it sums across lanes), and a lane's score is the
 * same sequence of vdpbf16ps over p = 0 .. D/2 - 1 whatever else fills the vector: a decode row
 * (8 lanes, a ymm) and the same row inside a verify of 9 (a zmm's half) get the same bits.
 *
 * Lanes: query r*G + g. A group of up to 3 vectors (16 lanes each; with G = 8 an odd row count
 * leaves a last ymm of 8) runs over the block's keys NK at a time, NK x vectors accumulators in
 * registers. */
#include "ft_kernels.h"

#ifdef FT_BF16DOT
/* Lanes the transposed queries of n = R*G queries take: whole vectors of 8 (G is 8 or 16). */
int att_lanes_width(int n) { return (n + 7) & ~7; }

/* qt[p][lane] = the bf16 pair (q[2p], q[2p+1]) of query lane, rounded to nearest even; q's rows
 * row_stride floats apart, each its G heads of D columns one after the other. */
void att_lanes_prep(const float *q, int64_t row_stride, int R, int G, int D, uint32_t *qt) {
    const int W = att_lanes_width(R * G);
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) {
            const float *src = q + r * row_stride + (int64_t)g * D;
            uint32_t *col = qt + r * G + g;
            for (int p = 0; p < D / 2; p++)
                col[(int64_t)p * W] = f32_to_bf16(src[2 * p]) | (uint32_t)f32_to_bf16(src[2 * p + 1]) << 16;
        }
    for (int p = 0; p < D / 2; p++)
        for (int l = R * G; l < W; l++) qt[(int64_t)p * W + l] = 0;
}

/* A vector of scaled scores of one key into its rows' score rows: lanes l0.. of the flat queries
 * are row l0 / G's heads (G = 16: one row; G = 8: a zmm's halves are two rows). */
FORCE_INLINE void lanes_store_z(float *sc, int64_t stride, int G, int l0, int64_t key, __m512 x) {
    float *at = sc + (int64_t)(l0 / G) * stride + key * G;
    if (G == 16) { _mm512_storeu_ps(at, x); return; }
    _mm256_storeu_ps(at, _mm512_castps512_ps256(x));
    _mm256_storeu_ps(at + stride, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
}

/* Chain c's multiply-adds of column pair p: NZ zmm vectors and HY (0/1) ymm of queries from
 * qrow against the NK keys k (their pair p broadcast). */
FORCE_INLINE void lanes_step(__m512 *az, __m256 *ay, const uint32_t *const *k, const uint32_t *qrow, int p,
                             const int NZ, const int HY, const int NK) {
    __m512bh qz[3];
    __m256bh qy = (__m256bh)_mm256_setzero_si256();
    /* the empty asm pins each query vector in a register: gcc otherwise reloaded it for every key
     * (a zmm load per vdpbf16ps, the load port the bound) */
    for (int v = 0; v < NZ; v++) {
        qz[v] = (__m512bh)_mm512_loadu_si512(qrow + 16 * v);
        __asm__("" : "+v"(qz[v]));
    }
    if (HY) {
        qy = (__m256bh)_mm256_loadu_si256((const __m256i *)(qrow + 16 * NZ));
        __asm__("" : "+v"(qy));
    }
    for (int kk = 0; kk < NK; kk++) {
        for (int v = 0; v < NZ; v++)
            az[kk * NZ + v] = _mm512_dpbf16_ps(az[kk * NZ + v], qz[v], (__m512bh)_mm512_set1_epi32((int)k[kk][p]));
        if (HY) ay[kk] = _mm256_dpbf16_ps(ay[kk], qy, (__m256bh)_mm256_set1_epi32((int)k[kk][p]));
    }
}

/* NZ zmm vectors and HY (0/1) ymm of queries from lane v0 against keys [j, j + NK) of the
 * block (kp: the block's rows as dword pairs; keys >= nb repeat the last and are not stored).
 * Two chains of accumulators, even and odd column pairs, added at the end: twice the
 * independent vdpbf16ps in flight for a decode row's 8 keys of one ymm each. */
FORCE_INLINE void lanes_tile(const uint32_t *const *kp, int64_t j, int64_t nb, const uint32_t *qt, int W, int P,
                             int v0, float scale, float *sc, int64_t stride, int G, const int NZ, const int HY,
                             const int NK) {
    __m512 az[2][12];                       /* fixed sizes: a VLA kept the accumulators in memory */
    __m256 ay[2][8];
    const uint32_t *k[8];
    const int keys = nb - j < NK ? (int)(nb - j) : NK;
    for (int kk = 0; kk < NK; kk++) {
        k[kk] = kp[j + (kk < keys ? kk : keys - 1)];
        for (int c = 0; c < 2; c++) {
            for (int v = 0; v < NZ; v++) az[c][kk * NZ + v] = _mm512_setzero_ps();
            if (HY) ay[c][kk] = _mm256_setzero_ps();
        }
    }
    int p = 0;
    for (; p + 1 < P; p += 2) {
        lanes_step(az[0], ay[0], k, qt + (int64_t)p * W + v0, p, NZ, HY, NK);
        lanes_step(az[1], ay[1], k, qt + (int64_t)(p + 1) * W + v0, p + 1, NZ, HY, NK);
    }
    if (p < P) lanes_step(az[0], ay[0], k, qt + (int64_t)p * W + v0, p, NZ, HY, NK);
    const __m512 sz = _mm512_set1_ps(scale);
    for (int kk = 0; kk < keys; kk++) {
        for (int v = 0; v < NZ; v++)
            lanes_store_z(sc, stride, G, v0 + 16 * v, j + kk,
                          _mm512_mul_ps(_mm512_add_ps(az[0][kk * NZ + v], az[1][kk * NZ + v]), sz));
        if (HY)     /* G = 8: one row */
            _mm256_storeu_ps(sc + (int64_t)((v0 + 16 * NZ) / 8) * stride + (j + kk) * 8,
                             _mm256_mul_ps(_mm256_add_ps(ay[0][kk], ay[1][kk]), _mm512_castps512_ps256(sz)));
    }
}

/* Scores of R rows x G heads (qt from att_lanes_prep) against the nb keys of a block (kp: their cache rows as bf16 pairs): row r's
 * key i at sc[r * stride + i * G + g], scaled (keys past a row's own count are computed too:
 * the caller reads each row's first ones). */
void att_scores_lanes(const uint32_t *const *kp, int64_t nb, int R, int G, int D, const uint32_t *qt, float scale,
                      float *sc, int64_t stride) {
    const int W = att_lanes_width(R * G), P = D / 2;
    for (int v0 = 0; v0 < W;) {
        const int zmm = (W - v0) / 16, ymm = (W - v0) % 16 ? 1 : 0;
        if (zmm >= 3) {
            for (int64_t j = 0; j < nb; j += 4) lanes_tile(kp, j, nb, qt, W, P, v0, scale, sc, stride, G, 3, 0, 4);
            v0 += 48;
        } else if (zmm == 2) {
            if (ymm) for (int64_t j = 0; j < nb; j += 4) lanes_tile(kp, j, nb, qt, W, P, v0, scale, sc, stride, G, 2, 1, 4);
            else for (int64_t j = 0; j < nb; j += 4) lanes_tile(kp, j, nb, qt, W, P, v0, scale, sc, stride, G, 2, 0, 4);
            v0 += 32 + 8 * ymm;
        } else if (zmm == 1) {
            if (ymm) for (int64_t j = 0; j < nb; j += 4) lanes_tile(kp, j, nb, qt, W, P, v0, scale, sc, stride, G, 1, 1, 4);
            else for (int64_t j = 0; j < nb; j += 8) lanes_tile(kp, j, nb, qt, W, P, v0, scale, sc, stride, G, 1, 0, 8);
            v0 += 16 + 8 * ymm;
        } else {
            for (int64_t j = 0; j < nb; j += 8) lanes_tile(kp, j, nb, qt, W, P, v0, scale, sc, stride, G, 0, 1, 8);
            v0 += 8;
        }
    }
}
#endif
