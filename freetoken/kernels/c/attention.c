#include "ft_kernels.h"

/* ------------------------------------------------------------------ decode attention
 * One new query token per sequence, attending all its keys straight in the paged cache (no
 * gather copy): out[s, h] = softmax_j(scale * <q[s,h], K[slot_sj, h/G]>) . V[slot_sj, h/G].
 * sinks (gpt-oss): one extra logit per query head in the denominator, its mass dropped.
 *
 * Split-K: work items are (sequence, kv head, chunk of keys), taken from a shared counter, so
 * one long sequence keeps every thread busy; each item leaves its G heads' unnormalized output,
 * max and sum (flash-decoding), and after a barrier each (sequence, query head) merges its
 * chunks. Within an item keys go in blocks of ATT_BLOCK rows: a bf16 block is widened to fp32
 * once into an L1 buffer and then serves all G query heads (widening inside every dot product
 * cost G times the conversions and bound the kernel on the shuffle port). */

#define ATT_BLOCK 32
#define ATT_CHUNK_MIN 256      /* keys per chunk at least: below that the merge costs more than the split saves */

typedef struct {
    const float *q; int S, Hq, Hkv, D;
    const uint8_t *k, *v; int kvt;          /* XT_F32 or XT_BF16 */
    const int64_t *slots; int64_t kmax; const int64_t *nkeys;
    float scale; const float *sinks;
    float *out;
    int nch; int64_t chunk;                 /* chunks per (sequence, kv head), keys per chunk */
    float *part;                            /* per item: G x (D + 2): unnormalized o, max m, sum l */
    float *tmp; int64_t tmp_stride;         /* per thread: scores G x chunk, then one fp32 block */
    _Atomic int next;
    ft_pool *p;
} att_job;

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
#endif


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

/* max(m0, p[0..n)), NaNs skipped: 4 vector accumulators (the scalar loop was bound on vmaxss's
 * latency, 1 element per 4 cycles, ~14% of the kernel's time). */
static float att_max(const float *p, int64_t n, float m0) {
    int64_t j = 0;
    float m = m0;
#ifdef FT_AVX512
    __m512 a0 = _mm512_set1_ps(m0), a1 = a0, a2 = a0, a3 = a0;
    for (; j + 64 <= n; j += 64) {
        a0 = _mm512_max_ps(_mm512_loadu_ps(p + j), a0);     /* max_ps(x, a) = a where x is NaN */
        a1 = _mm512_max_ps(_mm512_loadu_ps(p + j + 16), a1);
        a2 = _mm512_max_ps(_mm512_loadu_ps(p + j + 32), a2);
        a3 = _mm512_max_ps(_mm512_loadu_ps(p + j + 48), a3);
    }
    for (; j + 16 <= n; j += 16) a0 = _mm512_max_ps(_mm512_loadu_ps(p + j), a0);
    m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0, a1), _mm512_max_ps(a2, a3)));
#elif defined(FT_AVX2)
    __m256 a0 = _mm256_set1_ps(m0), a1 = a0;
    for (; j + 16 <= n; j += 16) {
        a0 = _mm256_max_ps(_mm256_loadu_ps(p + j), a0);
        a1 = _mm256_max_ps(_mm256_loadu_ps(p + j + 8), a1);
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_max_ps(a0, a1));
    for (int i = 0; i < 8; i++) m = t[i] > m ? t[i] : m;
#endif
    for (; j < n; j++) m = p[j] > m ? p[j] : m;
    return m;
}

/* Ask for the rows of the next block while this one is computed: the blocks lie in random
 * order in the paged cache, which the hardware prefetchers cannot follow. */
FORCE_INLINE void att_prefetch(const uint8_t *base, int64_t row_bytes, int64_t head_off, const int64_t *slots,
                               int64_t nb, int64_t bytes) {
    for (int64_t i = 0; i < nb; i++) {
        const char *r = (const char *)(base + slots[i] * row_bytes + head_off);
        for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(r + o, 0, 3);
    }
}

/* One block of nb key rows widened to fp32 [nb][D] in buf (bf16), or the cache rows themselves
 * (fp32); rows[i] points at row i either way. */
FORCE_INLINE void att_rows(const uint8_t *base, int64_t row_bytes, int64_t head_off, const int kvt,
                           const int64_t *slots, int64_t nb, int D, float *buf, const float **rows) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *r = base + slots[i] * row_bytes + head_off;
        if (kvt == XT_F32) { rows[i] = (const float *)r; continue; }
        const uint16_t *h = (const uint16_t *)r;
        float *o = buf + i * D;
        int c = 0;
#ifdef FT_AVX512
        for (; c + 16 <= D; c += 16)
            _mm512_storeu_ps(o + c, _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + c))), 16)));
#elif defined(FT_AVX2)
        for (; c + 8 <= D; c += 8)
            _mm256_storeu_ps(o + c, _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + c))), 16)));
#endif
        for (; c < D; c++) o[c] = bf16_to_f32(h[c]);
        rows[i] = o;
    }
}

/* sc[j] = scale * <q, rows[j]> for j < n. */
FORCE_INLINE void att_scores(const float *q, const float *const *rows, int64_t n, int D, float scale, float *sc) {
    int64_t j = 0;
#ifdef FT_AVX512
    if (D % 16 == 0) {
        for (; j + 4 <= n; j += 4) {
            const float *r0 = rows[j], *r1 = rows[j + 1], *r2 = rows[j + 2], *r3 = rows[j + 3];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < D; i += 16) {
                __m512 qv = _mm512_loadu_ps(q + i);
                a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r0 + i), a0);
                a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r1 + i), a1);
                a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r2 + i), a2);
                a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r3 + i), a3);
            }
            /* fold each to 8 lanes, then the 4-way hadd reduction */
#define FOLD(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(FOLD(a0), FOLD(a1)), _mm256_hadd_ps(FOLD(a2), FOLD(a3)));
#undef FOLD
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(sc + j, _mm_mul_ps(s4, _mm_set1_ps(scale)));
        }
    }
#endif
#ifdef FT_AVX2
    if (D % 8 == 0) {
        for (; j + 4 <= n; j += 4) {
            const float *r0 = rows[j], *r1 = rows[j + 1], *r2 = rows[j + 2], *r3 = rows[j + 3];
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < D; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r0 + i), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r1 + i), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r2 + i), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r3 + i), a3);
            }
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(sc + j, _mm_mul_ps(s4, _mm_set1_ps(scale)));
        }
    }
#endif
    for (; j < n; j++) {
        float acc = 0.f;
        for (int i = 0; i < D; i++) acc += q[i] * rows[j][i];
        sc[j] = acc * scale;
    }
}

#ifdef FT_AVX512
/* Scores of two query heads at once (sc0, sc1): each widened key vector loaded once serves both,
 * and 8 independent FMA chains keep both FMA ports busy (4 chains were bound on FMA latency). */
FORCE_INLINE void att_scores2(const float *q0, const float *q1, const float *const *rows, int64_t n, int D,
                              float scale, float *sc0, float *sc1) {
    int64_t j = 0;
    if (D % 16 == 0) {
#define FOLD(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
#define HSUM4(a0, a1, a2, a3, out) do { \
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(FOLD(a0), FOLD(a1)), _mm256_hadd_ps(FOLD(a2), FOLD(a3))); \
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)); \
            _mm_storeu_ps(out, _mm_mul_ps(s4, _mm_set1_ps(scale))); } while (0)
        for (; j + 4 <= n; j += 4) {
            const float *r0 = rows[j], *r1 = rows[j + 1], *r2 = rows[j + 2], *r3 = rows[j + 3];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int i = 0; i < D; i += 16) {
                const __m512 x = _mm512_loadu_ps(q0 + i), y = _mm512_loadu_ps(q1 + i);
                __m512 k = _mm512_loadu_ps(r0 + i);
                a0 = _mm512_fmadd_ps(x, k, a0); b0 = _mm512_fmadd_ps(y, k, b0);
                k = _mm512_loadu_ps(r1 + i);
                a1 = _mm512_fmadd_ps(x, k, a1); b1 = _mm512_fmadd_ps(y, k, b1);
                k = _mm512_loadu_ps(r2 + i);
                a2 = _mm512_fmadd_ps(x, k, a2); b2 = _mm512_fmadd_ps(y, k, b2);
                k = _mm512_loadu_ps(r3 + i);
                a3 = _mm512_fmadd_ps(x, k, a3); b3 = _mm512_fmadd_ps(y, k, b3);
            }
            HSUM4(a0, a1, a2, a3, sc0 + j);
            HSUM4(b0, b1, b2, b3, sc1 + j);
        }
#undef HSUM4
#undef FOLD
    }
    if (j < n) {
        att_scores(q0, rows + j, n - j, D, scale, sc0 + j);
        att_scores(q1, rows + j, n - j, D, scale, sc1 + j);
    }
}
#endif

/* o += sum_j w[j] * rows[j] with o held in registers: 128 (AVX-512) or 64 (AVX2) columns at a
 * time (8 accumulators, a constant count so they stay in registers), then one vector at a time. */
FORCE_INLINE void att_values(const float *w, const float *const *rows, int64_t n, int D, float *o) {
    int c0 = 0;
#ifdef FT_AVX512
    for (; c0 + 128 <= D; c0 += 128) {
        __m512 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm512_loadu_ps(o + c0 + 16 * u);
        for (int64_t j = 0; j < n; j++) {
            const __m512 wj = _mm512_set1_ps(w[j]);
            for (int u = 0; u < 8; u++) acc[u] = _mm512_fmadd_ps(wj, _mm512_loadu_ps(rows[j] + c0 + 16 * u), acc[u]);
        }
        for (int u = 0; u < 8; u++) _mm512_storeu_ps(o + c0 + 16 * u, acc[u]);
    }
    for (; c0 + 16 <= D; c0 += 16) {
        __m512 acc = _mm512_loadu_ps(o + c0);
        for (int64_t j = 0; j < n; j++) acc = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_loadu_ps(rows[j] + c0), acc);
        _mm512_storeu_ps(o + c0, acc);
    }
#endif
#ifdef FT_AVX2
    for (; c0 + 64 <= D; c0 += 64) {
        __m256 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm256_loadu_ps(o + c0 + 8 * u);
        for (int64_t j = 0; j < n; j++) {
            const __m256 wj = _mm256_set1_ps(w[j]);
            for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(rows[j] + c0 + 8 * u), acc[u]);
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(o + c0 + 8 * u, acc[u]);
    }
    for (; c0 + 8 <= D; c0 += 8) {
        __m256 acc = _mm256_loadu_ps(o + c0);
        for (int64_t j = 0; j < n; j++) acc = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps(rows[j] + c0), acc);
        _mm256_storeu_ps(o + c0, acc);
    }
#endif
    for (int c = c0; c < D; c++) {
        float acc = o[c];
        for (int64_t j = 0; j < n; j++) acc += w[j] * rows[j][c];
        o[c] = acc;
    }
}

/* Item (s, h, keys [j0, j1)): writes per query head g its unnormalized output, max and sum to part. */
FORCE_INLINE void att_chunk(const att_job *A, int s, int h, int64_t j0, int64_t j1, float *sc, float *buf,
                            float *part, const int kvt) {
    const int G = A->Hq / A->Hkv, D = A->D;
    const int64_t es = kvt == XT_F32 ? 4 : 2, row_bytes = (int64_t)A->Hkv * D * es, head_off = (int64_t)h * D * es;
    const int64_t n = j1 - j0, *slots = A->slots + (int64_t)s * A->kmax + j0;
    const float *q = A->q + ((int64_t)s * A->Hq + (int64_t)h * G) * D;
    const float *rows[ATT_BLOCK];
    for (int64_t b = 0; b < n; b += ATT_BLOCK) {
        const int64_t nb = n - b < ATT_BLOCK ? n - b : ATT_BLOCK, b2 = b + ATT_BLOCK;
        if (b2 < n) att_prefetch(A->k, row_bytes, head_off, slots + b2, n - b2 < ATT_BLOCK ? n - b2 : ATT_BLOCK, D * es);
        else att_prefetch(A->v, row_bytes, head_off, slots, n < ATT_BLOCK ? n : ATT_BLOCK, D * es);   /* V's first block */
        att_rows(A->k, row_bytes, head_off, kvt, slots + b, nb, D, buf, rows);
        int g = 0;
#ifdef FT_AVX512
        for (; g + 2 <= G; g += 2)
            att_scores2(q + (int64_t)g * D, q + (int64_t)(g + 1) * D, rows, nb, D, A->scale, sc + g * n + b,
                        sc + (g + 1) * n + b);
#endif
        for (; g < G; g++) att_scores(q + (int64_t)g * D, rows, nb, D, A->scale, sc + g * n + b);
    }
    for (int g = 0; g < G; g++) {
        float *r = sc + g * n, m = att_max(r, n, -INFINITY);
        float *pg = part + (int64_t)g * (D + 2);
        pg[D] = m;
        pg[D + 1] = att_exp(r, n, m);
        memset(pg, 0, (size_t)D * 4);
    }
    for (int64_t b = 0; b < n; b += ATT_BLOCK) {
        const int64_t nb = n - b < ATT_BLOCK ? n - b : ATT_BLOCK, b2 = b + ATT_BLOCK;
        if (b2 < n) att_prefetch(A->v, row_bytes, head_off, slots + b2, n - b2 < ATT_BLOCK ? n - b2 : ATT_BLOCK, D * es);
        att_rows(A->v, row_bytes, head_off, kvt, slots + b, nb, D, buf, rows);
        for (int g = 0; g < G; g++) att_values(sc + g * n + b, rows, nb, D, part + (int64_t)g * (D + 2));
    }
}

static void att_fn(void *a, int tid) {
    att_job *A = a;
    const int G = A->Hq / A->Hkv, D = A->D, items = A->S * A->Hkv * A->nch;
    float *sc = A->tmp + (int64_t)tid * A->tmp_stride, *buf = sc + (int64_t)G * A->chunk;
    for (int it; (it = atomic_fetch_add(&A->next, 1)) < items;) {
        const int c = it % A->nch, sh = it / A->nch, s = sh / A->Hkv, h = sh % A->Hkv;
        const int64_t j0 = (int64_t)c * A->chunk, n = A->nkeys[s];
        const int64_t j1 = j0 + A->chunk < n ? j0 + A->chunk : n;
        float *part = A->part + (int64_t)it * G * (D + 2);
        if (j0 >= j1) {
            for (int g = 0; g < G; g++) { part[(int64_t)g * (D + 2) + D] = -INFINITY; part[(int64_t)g * (D + 2) + D + 1] = 0.f; }
            continue;
        }
        if (A->kvt == XT_F32) att_chunk(A, s, h, j0, j1, sc, buf, part, XT_F32);
        else att_chunk(A, s, h, j0, j1, sc, buf, part, XT_BF16);
    }
    pool_barrier(A->p);
    /* merge the chunks of each (sequence, query head) */
    for (int sq = tid; sq < A->S * A->Hq; sq += A->p->active) {
        const int s = sq / A->Hq, hq = sq % A->Hq, h = hq / G, g = hq % G;
        const float *first = A->part + ((int64_t)(s * A->Hkv + h) * A->nch * G + g) * (D + 2);
        const int64_t step = (int64_t)G * (D + 2);
        float m = A->sinks ? A->sinks[hq] : -INFINITY;
        for (int c = 0; c < A->nch; c++) m = first[c * step + D] > m ? first[c * step + D] : m;
        float l = A->sinks ? expf(A->sinks[hq] - m) : 0.f;
        float *o = A->out + (int64_t)sq * D;
        memset(o, 0, (size_t)D * 4);
        for (int c = 0; c < A->nch; c++) {
            const float *pc = first + c * step;
            if (pc[D + 1] == 0.f) continue;
            const float w = expf(pc[D] - m);
            l += w * pc[D + 1];
            for (int i = 0; i < D; i++) o[i] += w * pc[i];
        }
        const float inv = 1.f / l;
        for (int i = 0; i < D; i++) o[i] *= inv;
    }
}

/* q fp32 [S, Hq, D]; k/v caches [slots, Hkv, D] (fp32 or bf16); slots int64 [S, kmax] with
 * nkeys[s] valid entries; sinks fp32 [Hq] or NULL; out fp32 [S, Hq, D]. 0, or -2 (memory). */
int ft_decode_attention(void *vp, const float *q, int S, int Hq, int Hkv, int D, const void *k, const void *v,
                        int kvt, const int64_t *slots, int64_t kmax, const int64_t *nkeys, float scale,
                        const float *sinks, float *out) {
    ft_pool *p = vp;
    const int G = Hq / Hkv;
    int64_t longest = 0, kv_rows = 0;
    for (int s = 0; s < S; s++) { kv_rows += nkeys[s]; longest = nkeys[s] > longest ? nkeys[s] : longest; }
    /* enough items for ~4 per thread, chunks of at least ATT_CHUNK_MIN keys */
    const int64_t pairs = (int64_t)S * Hkv, want = 4 * (int64_t)p->n;
    int64_t nch = pairs >= want ? 1 : (want + pairs - 1) / pairs;
    int64_t chunk = (longest + nch - 1) / nch;
    chunk = chunk < ATT_CHUNK_MIN ? ATT_CHUNK_MIN : chunk;
    chunk = (chunk + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK;
    nch = (longest + chunk - 1) / chunk;
    if (nch < 1) nch = 1;
    const int64_t items = pairs * nch;
    const int64_t part_floats = items * G * (D + 2), tmp_stride = ((int64_t)G * chunk + (int64_t)ATT_BLOCK * D + 15) & ~(int64_t)15;
    float *mem = (float *)scratch(p, (size_t)(part_floats + tmp_stride * p->n + 16) * 4);
    if (!mem) return -2;
    att_job A = {q, S, Hq, Hkv, D, k, v, kvt, slots, kmax, nkeys, scale, sinks, out, (int)nch, chunk,
                 mem, mem + ((part_floats + 15) & ~(int64_t)15), tmp_stride, 0, p};
    pool_run_sized(p, att_fn, &A, kv_rows * 2 * Hkv * D * (kvt == XT_F32 ? 4 : 2));
    return 0;
}
