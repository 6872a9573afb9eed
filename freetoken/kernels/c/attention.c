#include "ft_kernels.h"
#ifdef __x86_64__
#include <xmmintrin.h>
#endif

/* ------------------------------------------------------------------ decode attention
 * One new query token per sequence, attending all its keys straight in the paged cache (no
 * gather copy): out[s, h] = softmax_j(scale * <q[s,h], K[slot_sj, h/G]>) . V[slot_sj, h/G].
 * sinks (gpt-oss): one extra logit per query head in the denominator, its mass dropped.
 *
 * Split-K: work items are (sequence, kv head, chunk of keys), taken from a shared counter, so
 * one long sequence keeps every thread busy. A sequence's chunks follow from its own key count
 * and the pool's size only, never from the other rows of the call: a verify row (one query of a
 * drafted position) then sums in the order of the decode step at its position, and a sequence
 * decoded in a batch gets the bits it gets alone. Each item leaves its G heads' unnormalized output,
 * max and sum (flash-decoding), and after a barrier each (sequence, query head) merges its
 * chunks. Within an item, two passes over its keys in blocks of ATT_BLOCK rows: the scores of
 * all G query heads (the K block read once for the group), the softmax numerators, then the
 * values (each V row slice read once for the group), fp32 FMAs throughout. The block loops are
 * attention_blocks.c. Denormals are flushed inside the kernel (FTZ/DAZ, restored after): an
 * exp() underflowing to ~1e-38 weighs nothing beside the maximum's 1, but a denormal
 * accumulator made every FMA of a block take a microcode assist (~20x slower). */

#define ATT_BLOCK 32
#define ATT_PF_LOC 2           /* __builtin_prefetch locality 2 = prefetcht1: the next block into L2 (1.7x from DRAM on Zen 4) */
#define ATT_CHUNK_MIN 256      /* keys per chunk at least: below that the merge costs more than the split saves */
#define ATT_ROWS_MAX 16        /* rows of one sequence an item serves at most (a verify of up to 15 drafts) */
/* a row's floats of an item's scratch: scores [chunk][G], qf [G+1][Dp], acc [G][Dp], m and l [G] */
#define ATT_ROW_WS(chunk, G, Dp) (((chunk) * (G) + (int64_t)(2 * (G) + 1) * (Dp) + 2 * (G) + 15) & ~(int64_t)15)

typedef struct {
    const float *q; int S, Hq, Hkv, D, Dp;  /* Dp: D rounded up to 32 (zero-padded rows) */
    const uint8_t *k, *v; int kvt;          /* XT_F32 or XT_BF16 */
    const int64_t *slots; int64_t kmax; const int64_t *nkeys;
    float scale; const float *sinks;
    float *out;
    int nch; int64_t chunk;                 /* chunks of the longest sequence, and its keys per chunk */
    int amx;                                /* scores and values on AMX tiles (attention_amx.c) */
    int64_t want;                           /* chunks a sequence is split into at most (att_seq_chunk) */
    const int *rows;                        /* per row: rows of its group if it leads one, else 0 */
    float *part;                            /* per item: G x (D + 2): unnormalized o, max m, sum l */
    float *tmp; int64_t tmp_stride;         /* per thread: scores, queries, accumulators, one block */
    _Atomic int next;
    ft_pool *p;
} att_job;

/* Ask for the rows of the next block while this one is computed: the blocks lie in random
 * order in the paged cache, which the hardware prefetchers cannot follow. Into L2
 * (prefetcht1), not L1: a block's 32 rows are ~128 lines in flight, more than L1's miss
 * buffers hold; on a Zen 4 core prefetcht0 made the kernel 1.7x slower from DRAM (4096 keys,
 * 123 vs 72 ns per key and KV head), cache-resident blocks ran the same. */
FORCE_INLINE void att_prefetch(const uint8_t *base, int64_t row_bytes, int64_t head_off, const int64_t *slots,
                               int64_t nb, int64_t bytes) {
    for (int64_t i = 0; i < nb; i++) {
        const char *r = (const char *)(base + slots[i] * row_bytes + head_off);
        for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(r + o, 0, ATT_PF_LOC);
    }
}

/* One block of nb key rows as fp32 [Dp] rows (zero padded): widened into buf (bf16), or the
 * cache rows themselves (fp32 with D == Dp); rows[i] points at row i either way. */
FORCE_INLINE void att_rows(const uint8_t *base, int64_t row_bytes, int64_t head_off, const int kvt,
                           const int64_t *slots, int64_t nb, int D, int Dp, float *buf, const float **rows) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *r = base + slots[i] * row_bytes + head_off;
        if (kvt == XT_F32 && D == Dp) { rows[i] = (const float *)r; continue; }
        float *o = buf + i * Dp;
        int c = 0;
        if (kvt == XT_BF16) {
            const uint16_t *h = (const uint16_t *)r;
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
        } else {
            memcpy(o, r, (size_t)D * 4);
            c = D;
        }
        for (; c < Dp; c++) o[c] = 0.f;
        rows[i] = o;
    }
}

/* Row s's part of item (s, h, chunk c): its G heads' unnormalized outputs in column order, max
 * and sum; acc NULL: the row has no keys in the chunk. */
static void att_part(const att_job *A, int s, int h, int c, int vkind, const float *acc, const float *m) {
    const int G = A->Hq / A->Hkv, D = A->D;
    float *part = A->part + ((int64_t)(s * A->Hkv + h) * A->nch + c) * G * (D + 2);
    for (int g = 0; g < G; g++) {
        float *pg = part + (int64_t)g * (D + 2);
        pg[D] = acc ? m[g] : -INFINITY;
        pg[D + 1] = acc ? m[G + g] : 0.f;
    }
    for (int pos = 0; acc && pos < A->Dp; pos++) {
        const int col = att_col(vkind, G, pos);
        if (col < D)
            for (int g = 0; g < G; g++) part[(int64_t)g * (D + 2) + col] = acc[(int64_t)g * A->Dp + pos];
    }
}

/* Rows [s0, s0 + R) of one sequence (a verify's rows: the same key slots, row r reading its
 * first nkeys[r]) against KV head h, keys [j0, j0 + chunk) of each row's own range: writes per
 * row and query head g its unnormalized output, max and sum to its part. Each block of keys is
 * read (and widened) once for all the rows; every row then runs the one-row block loops on it
 * with its own key count, in the order a decode step at its position runs them, so each row
 * gets the bits it gets alone. Two passes: all scores (then the softmax numerators), then the
 * values. */
FORCE_INLINE void att_chunk(const att_job *A, int s0, int R, int h, int64_t j0, int64_t chunk, float *ws,
                            const int kvt) {
    const int G = A->Hq / A->Hkv, D = A->D, Dp = A->Dp;
    const int64_t es = kvt == XT_F32 ? 4 : 2, row_bytes = (int64_t)A->Hkv * D * es, head_off = (int64_t)h * D * es;
    int64_t nr[ATT_ROWS_MAX], n = 0;     /* keys of each row in this chunk, and of the longest */
    int sl = s0;                          /* the longest row: its slots cover every row's keys */
    for (int r = 0; r < R; r++) {
        const int64_t e = A->nkeys[s0 + r] < j0 + chunk ? A->nkeys[s0 + r] : j0 + chunk;
        nr[r] = e > j0 ? e - j0 : 0;
        if (nr[r] > n) { n = nr[r]; sl = s0 + r; }
    }
    const int64_t *slots = A->slots + (int64_t)sl * A->kmax + j0;
    const int64_t row_ws = ATT_ROW_WS(A->chunk, G, Dp);
    float *buf = ws + R * row_ws;
#define ROW_SC(r) (ws + (r) * row_ws)
#define ROW_QF(r) (ROW_SC(r) + A->chunk * G)
#define ROW_ACC(r) (ROW_QF(r) + (int64_t)(G + 1) * Dp)
#define ROW_M(r) (ROW_ACC(r) + (int64_t)G * Dp)
    /* bf16 scores (ft_bf16_dot_on, a bf16 cache): q rounded to bf16 once, as llama.cpp does;
     * vdpbf16ps on the rows in place where G divides the 16 lanes, else the same products emulated;
     * G = 8 or 16: all R rows' queries as the lanes of one tile (attention_lanes.c), chosen by the
     * shape alone, never by R, so a verify row sums as the decode row at its position does */
    int qmode = kvt == XT_BF16 && ft_bf16_dot_on ? ATT_Q_ROUNDED : ATT_Q_F32;
#ifdef FT_BF16DOT
    if (qmode == ATT_Q_ROUNDED && 16 % G == 0) qmode = (G == 8 || G == 16) && D % 2 == 0 ? ATT_Q_LANES : ATT_Q_BF16;
    uint32_t *qt = (uint32_t *)(buf + (int64_t)ATT_BLOCK * Dp);     /* ATT_Q_LANES: all rows' queries, transposed */
    if (qmode == ATT_Q_LANES) att_lanes_prep(A->q + ((int64_t)s0 * A->Hq + (int64_t)h * G) * D, (int64_t)A->Hq * D, R, G, D, qt);
    else
#endif
    for (int r = 0; r < R; r++)
        att_prep_q(A->q + ((int64_t)(s0 + r) * A->Hq + (int64_t)h * G) * D, G, D, Dp, ROW_QF(r), qmode);
    const float *rows[ATT_BLOCK];
    for (int64_t b = 0; b < n; b += ATT_BLOCK) {
        const int64_t nb = n - b < ATT_BLOCK ? n - b : ATT_BLOCK, b2 = b + ATT_BLOCK;
        if (b2 < n) att_prefetch(A->k, row_bytes, head_off, slots + b2, n - b2 < ATT_BLOCK ? n - b2 : ATT_BLOCK, D * es);
        else att_prefetch(A->v, row_bytes, head_off, slots, n < ATT_BLOCK ? n : ATT_BLOCK, D * es);   /* V's first block */
#ifdef FT_BF16DOT
        if (qmode == ATT_Q_LANES) {
            const uint32_t *kp[ATT_BLOCK];
            for (int64_t i = 0; i < nb; i++) kp[i] = (const uint32_t *)(A->k + slots[b + i] * row_bytes + head_off);
            att_scores_lanes(kp, nb, R, G, D, qt, A->scale, ROW_SC(0) + b * G, row_ws);
            continue;
        }
        if (qmode == ATT_Q_BF16) {
            const uint16_t *kr[ATT_BLOCK];
            for (int64_t i = 0; i < nb; i++) kr[i] = (const uint16_t *)(A->k + slots[b + i] * row_bytes + head_off);
            for (int r = 0; r < R; r++)
                if (nr[r] > b)
                    att_scores_block_bf16(kr, nr[r] - b < nb ? nr[r] - b : nb, G, D, Dp, (const uint16_t *)ROW_QF(r),
                                          A->scale, ROW_SC(r) + b * G);
            continue;
        }
#endif
        att_rows(A->k, row_bytes, head_off, kvt, slots + b, nb, D, Dp, buf, rows);
        for (int r = 0; r < R; r++)
            if (nr[r] > b)
                att_scores_block(rows, nr[r] - b < nb ? nr[r] - b : nb, G, D, Dp, ROW_QF(r), A->scale, ROW_SC(r) + b * G);
    }
    for (int r = 0; r < R; r++) {
        att_softmax(ROW_SC(r), nr[r], G, ROW_M(r), ROW_M(r) + G);
        memset(ROW_ACC(r), 0, (size_t)G * Dp * 4);
    }
    const int vkind = qmode == ATT_Q_F32 ? kvt : ATT_KV_BF16P;     /* the values' weights rounded alike */
    const uint8_t *vr[ATT_BLOCK];
    for (int64_t b = 0; b < n; b += ATT_BLOCK) {
        const int64_t nb = n - b < ATT_BLOCK ? n - b : ATT_BLOCK, b2 = b + ATT_BLOCK;
        if (b2 < n) att_prefetch(A->v, row_bytes, head_off, slots + b2, n - b2 < ATT_BLOCK ? n - b2 : ATT_BLOCK, D * es);
        for (int64_t i = 0; i < nb; i++) vr[i] = A->v + slots[b + i] * row_bytes + head_off;
        att_values_rows(vr, vkind, nb, b, nr, R, G, D, Dp, ROW_SC(0) + b * G, row_ws, ROW_ACC(0));
    }
    for (int r = 0; r < R; r++) att_part(A, s0 + r, h, j0 / chunk, vkind, nr[r] ? ROW_ACC(r) : NULL, ROW_M(r));
#undef ROW_SC
#undef ROW_QF
#undef ROW_ACC
#undef ROW_M
}

#ifdef FT_AMX
/* att_chunk on AMX tiles (bf16 caches): the same rows, keys and chunks, attention_amx.c's item. */
static void att_chunk_amx(const att_job *A, int s0, int R, int h, int64_t j0, int64_t chunk, float *ws) {
    const int G = A->Hq / A->Hkv, D = A->D;
    const int64_t row_bytes = (int64_t)A->Hkv * D * 2, head_off = (int64_t)h * D * 2;
    int64_t nr[ATT_ROWS_MAX], n = 0;
    int sl = s0;
    for (int r = 0; r < R; r++) {
        const int64_t e = A->nkeys[s0 + r] < j0 + chunk ? A->nkeys[s0 + r] : j0 + chunk;
        nr[r] = e > j0 ? e - j0 : 0;
        if (nr[r] > n) { n = nr[r]; sl = s0 + r; }
    }
    float ml[2 * R * G];
    const float *o = att_amx_item(A->q + ((int64_t)s0 * A->Hq + (int64_t)h * G) * D, (int64_t)A->Hq * D, R, G, D,
                                  A->Dp, A->k, A->v, row_bytes, head_off, A->slots + (int64_t)sl * A->kmax + j0, nr, n,
                                  A->chunk, A->scale, ws, ml);
    for (int r = 0; r < R; r++)
        att_part(A, s0 + r, h, (int)(j0 / chunk), XT_F32, nr[r] ? o + (int64_t)r * G * A->Dp : NULL, ml + 2 * r * G);
}
#endif

/* Keys per chunk of a sequence of n keys: n split `want` ways, at least ATT_CHUNK_MIN (below
 * that the merge costs more than the split saves), whole blocks. */
static int64_t att_seq_chunk(int64_t n, int64_t want) {
    int64_t chunk = (n + want - 1) / want;
    chunk = chunk < ATT_CHUNK_MIN ? ATT_CHUNK_MIN : chunk;
    return (chunk + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK;
}

/* Groups of consecutive rows that read the same keys (a verify's rows of one sequence: the same
 * slots over each row's keys) and cut them into the same chunks: rows[s] = the group's size at
 * its first row, 0 at the others. Returns the largest group's size. */
static int att_groups(int S, const int64_t *slots, int64_t kmax, const int64_t *nkeys, int64_t want, int *rows) {
    int most = 1;
    for (int s = 0, lead = 0; s < S; s++) {
        if (s > lead && s - lead < ATT_ROWS_MAX && att_seq_chunk(nkeys[s], want) == att_seq_chunk(nkeys[lead], want)
            && !memcmp(slots + (int64_t)s * kmax, slots + (int64_t)lead * kmax, (size_t)(nkeys[s] > nkeys[lead] ? nkeys[s] : nkeys[lead]) * 8)) {
            rows[s] = 0;
            rows[lead]++;
            most = rows[lead] > most ? rows[lead] : most;
        } else {
            rows[s] = 1;
            lead = s;
        }
    }
    return most;
}

static void att_fn(void *a, int tid) {
    att_job *A = a;
    const int G = A->Hq / A->Hkv, D = A->D, items = A->S * A->Hkv * A->nch;
    (void)G;
    float *ws = A->tmp + (int64_t)tid * A->tmp_stride;
#ifdef __x86_64__
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);               /* FTZ | DAZ, see the top of this file */
#endif
#ifdef FT_AMX
    if (A->amx) amx_config();
#endif
    for (int it; (it = atomic_fetch_add(&A->next, 1)) < items;) {
        const int c = it % A->nch, sh = it / A->nch, s = sh / A->Hkv, h = sh % A->Hkv;
        if (!A->rows[s]) continue;          /* its group's first row serves it */
        const int64_t chunk = att_seq_chunk(A->nkeys[s], A->want);
#ifdef FT_AMX
        if (A->amx) { att_chunk_amx(A, s, A->rows[s], h, (int64_t)c * chunk, chunk, ws); continue; }
#endif
        if (A->kvt == XT_F32) att_chunk(A, s, A->rows[s], h, (int64_t)c * chunk, chunk, ws, XT_F32);
        else att_chunk(A, s, A->rows[s], h, (int64_t)c * chunk, chunk, ws, XT_BF16);
    }
#ifdef FT_AMX
    if (A->amx) _tile_release();
#endif
#ifdef __x86_64__
    _mm_setcsr(csr);
#endif
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
    /* one sequence alone makes ~4 items per thread; each sequence is cut by that rule whatever
     * else is in the call (att_seq_chunk), so the longest has the longest chunks, but not always
     * the most (3450 keys cut 12 ways make 288-key chunks, 3461 keys 11 of 320) */
    const int64_t pairs = (int64_t)S * Hkv, want = (4 * (int64_t)p->n + Hkv - 1) / Hkv;
    const int64_t chunk = att_seq_chunk(longest, want);
    int64_t nch = 1;
    for (int s = 0; s < S; s++) {
        const int64_t c = att_seq_chunk(nkeys[s], want), n = (nkeys[s] + c - 1) / c;
        nch = n > nch ? n : nch;
    }
    const int64_t items = pairs * nch;
    const int Dp = (D + 31) & ~31;
    int *grp = malloc((size_t)S * sizeof(int));
    if (!grp) return -2;
    const int most = att_groups(S, slots, kmax, nkeys, want, grp);
    /* per thread: each row of a group its ATT_ROW_WS, and one fp32 block [ATT_BLOCK][Dp] */
    const int amx = kvt == XT_BF16 && ft_att_amx;
    int64_t tmp_stride = most * ATT_ROW_WS(chunk, G, Dp) + (int64_t)ATT_BLOCK * Dp;
#ifdef FT_BF16DOT
    tmp_stride += ((int64_t)(D / 2) * att_lanes_width(most * G) + 15) & ~(int64_t)15;   /* ATT_Q_LANES: the transposed queries */
#endif
#ifdef FT_AMX
    if (amx) {
        const int64_t t = (att_amx_ws_bytes(most, G, Dp, chunk) / 4 + 15) & ~(int64_t)15;
        tmp_stride = t > tmp_stride ? t : tmp_stride;
    }
#endif
    const int64_t part_floats = items * G * (D + 2);
    float *mem = (float *)scratch(p, (size_t)(part_floats + tmp_stride * p->n + 16) * 4);
    if (!mem) { free(grp); return -2; }
    att_job A = {q, S, Hq, Hkv, D, Dp, k, v, kvt, slots, kmax, nkeys, scale, sinks, out, (int)nch, chunk, amx, want, grp,
                 mem, mem + ((part_floats + 15) & ~(int64_t)15), tmp_stride, 0, p};
    pool_run_sized(p, att_fn, &A, kv_rows * 2 * Hkv * D * (kvt == XT_F32 ? 4 : 2));
    free(grp);
    return 0;
}
