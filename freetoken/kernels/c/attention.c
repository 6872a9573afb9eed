#include "ft_kernels.h"

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
