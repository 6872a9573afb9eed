#include "ft_kernels.h"

/* ------------------------------------------------------------------ dense linear (decode)
 * y[t, r] = <W row r, x[t]> (+ bias[r]) for the few tokens of a decode step: the same dot tiles
 * as the experts, every thread streaming its own disjoint range of output rows. Weights in any
 * format above (dense layers use fp32/bf16/fp16/int8; fp8 scales per 128 rows as in the banks),
 * or ggml segments (ft_ggml_linear_run in ggml_dense.c runs this same driver). */

typedef struct {
    ft_gemv_rows W;
    int N, K;
    const void *x; int xt; int64_t M;
    const float *bias;
    float *y; int64_t ldy;
    uint8_t *xq; float *tmp;
    ft_pool *p;
} gemv_job;

/* The segment holding global row r (segments are few: a linear scan). */
static inline const ft_gseg *seg_of(const ft_gseg *seg, int nseg, int r, int *local) {
    for (int i = 0; i < nseg - 1; i++) {
        if (r < seg[i].rows) { *local = r; return seg + i; }
        r -= seg[i].rows;
    }
    *local = r;
    return seg + nseg - 1;
}

/* Row r's weight and scale pointers; returns its row stride (the prefetch distance). Once per
 * 2-4 rows of a dot tile, so the branch costs nothing beside the tile. */
static inline int64_t row_at(const ft_gemv_rows *W, int r, const uint8_t **w, const uint8_t **s) {
    if (!W->seg) {
        *w = W->w + (int64_t)r * W->w_rs;
        *s = scale_row(W->fmt, W->s, 0, W->s_rs, 0, r);
        return W->w_rs;
    }
    int lr;
    const ft_gseg *g = seg_of(W->seg, W->nseg, r, &lr);
    *w = g->w + (int64_t)lr * g->rs;
    *s = (const uint8_t *)&g->type;
    return g->rs;
}

/* The first row (a multiple of 16, at most N) where `bytes` of the segments' rows are behind. */
static int row_after(const ft_gemv_rows *W, int N, int64_t bytes) {
    int base = 0;
    for (int i = 0; i < W->nseg; i++) {
        const ft_gseg *g = W->seg + i;
        if (bytes < (int64_t)g->rows * g->rs) {
            const int r = (base + (int)((bytes + g->rs - 1) / g->rs) + 8) / 16 * 16;
            return r < N ? r : N;
        }
        bytes -= (int64_t)g->rows * g->rs;
        base += g->rows;
    }
    return N;
}

/* Thread tid's rows [lo, hi): units of 16 rows, segments split by the bytes they read, so a fused
 * q|k|v whose parts differ in width (Q4_K_M's Q6_K attn_v rows: 1.46x its Q4_K rows) keeps both
 * threads' streams the same length. */
static void split_rows(const ft_gemv_rows *W, int N, int nth, int tid, int *lo, int *hi) {
    if (!W->seg || W->nseg == 1) { split(N, 16, nth, tid, lo, hi); return; }
    int64_t total = 0;
    for (int i = 0; i < W->nseg; i++) total += (int64_t)W->seg[i].rows * W->seg[i].rs;
    *lo = tid == 0 ? 0 : row_after(W, N, total * tid / nth);
    *hi = tid == nth - 1 ? N : row_after(W, N, total * (tid + 1) / nth);
}

#ifdef FT_BF16DOT
/* Rows [r0, r1) with vdpbf16ps (bf16dot.c): a tile of rows takes every token in passes of a few,
 * its weights read from memory once and from L1/L2 per further pass. */
static void gemv_rows_bf16_pairs(const gemv_job *L, int r0, int r1, int64_t xs) {
    const int q = bf16_pairs_tokens(L->M), R = BW_ROWS(q);
    /* lines of the next tile prefetched a step per row: 4 (3 in 3-row tiles) where the tile takes its
     * tokens in one pass, 2 where it takes several (a C loop of this GEMV over 256 MiB of 2048-wide
     * rows on 2 MiB pages, one thread, 21 alternating rounds, medians, x 2 lines: one pass 1.07x
     * with 1 line, 0.83-0.93x with 4 at 4-6 tokens, 0.87-0.93x with 3 at 7-9 in 3-row tiles; two
     * passes 1.11-1.24x with 4, 1.20-1.36x with none in the later passes, 0.94-1.05x with 1). On
     * 4 KiB pages the counts had been 4 / 3 / 2 at 1-3 / 4-5 / 6+ tokens. */
    const int pf_lines = L->M > q ? 2 : R == 4 ? 4 : 3;
    for (int r = r0; r < r1; r += R) {
        const int m = r + R <= r1 ? R : r1 - r;
        const uint8_t *wr[4], *sr[4];
        int64_t rs = 0;
        for (int j = 0; j < m; j++) {
            const int64_t s = row_at(&L->W, r + j, &wr[j], &sr[j]);
            if (j == 0) rs = s;
        }
        tl_pf = pf_distance((int64_t)m * rs, rs);
        for (int64_t c = 0; c < L->M; c += q) {
            const int nt = L->M - c < q ? (int)(L->M - c) : q;
            float res[4 * BW_TOK];
            dot_rows_bf16_pairs(wr, m, L->K, L->xq + c * xs, xs, nt, res, BW_TOK, pf_lines);
            for (int j = 0; j < m; j++)
                for (int t = 0; t < nt; t++)
                    L->y[(c + t) * L->ldy + r + j] = L->bias ? res[j * BW_TOK + t] + L->bias[r + j]
                                                                 : res[j * BW_TOK + t];
        }
    }
}
#endif

/* Bytes between two tokens' prepared x: prep_bytes, but for the bf16 pairs (2 bytes a column) an
 * odd number of cache lines, so the up to BW_TOK tokens a pass reads fall in distinct L1 sets (at
 * prep_bytes' 8 KB for K = 2048 they all share one 8-way set with the weight rows). */
static int64_t x_stride(int fmt, int K) {
#ifdef FT_BF16DOT
    if (fmt == FMT_BF16 && ft_bf16_dot_on) return 64 * ((((int64_t)K * 2 + 63) / 64) | 1);
#endif
    (void)fmt;
    return prep_bytes(K);
}

static void gemv_fn(void *a, int tid) {
    gemv_job *L = a;
    const int fmt = L->W.fmt, N = L->N, K = L->K, nth = L->p->active;
    const int64_t xs = x_stride(fmt, K);
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
    split_rows(&L->W, N, nth, tid, &r0, &r1);
#ifdef FT_BF16DOT
    if (fmt == FMT_BF16 && ft_bf16_dot_on) { gemv_rows_bf16_pairs(L, r0, r1, xs); return; }
#endif
    for (int rb = r0; rb < r1; rb += RB)
    for (int64_t c = 0; c < L->M; c += NTMAX) {
        const int nt = L->M - c < NTMAX ? (int)(L->M - c) : NTMAX;
        const int re = rb + RB < r1 ? rb + RB : r1;
        const uint8_t *xp[NTMAX];
        for (int t = 0; t < nt; t++) xp[t] = L->xq + (c + t) * xs;
        const int rr = fmt == FMT_GGML && nt == 1 && K <= GGML_WIDE_MAX ? GGML_TILE_ROWS : nt == 1 || wide_tiles(fmt) ? 4 : 2;
        for (int r = rb; r < re; r += rr) {
            const int m = r + rr <= re ? rr : re - r;
            const uint8_t *wr[GGML_TILE_ROWS], *sr[GGML_TILE_ROWS];
            float res[GGML_TILE_ROWS][NTMAX];
            int64_t rs = 0;
            for (int q = 0; q < m; q++) {
                const int64_t s = row_at(&L->W, r + q, &wr[q], &sr[q]);
                if (q == 0) rs = s;
            }
            tl_pf = pf_distance((int64_t)(m < 4 ? m : 4) * rs, rs);   /* a tile of four rows ahead, as for the others */
            dot_tile(fmt, wr, sr, m, K, xp, nt, res);
            for (int q = 0; q < m; q++)
                for (int t = 0; t < nt; t++)
                    L->y[(c + t) * L->ldy + r + q] = L->bias ? res[q][t] + L->bias[r + q] : res[q][t];
        }
    }
}

int gemv_run(ft_pool *p, const ft_gemv_rows *W, int N, int K, const void *x, int xt, int64_t M,
             const float *bias, float *y, int64_t ldy, int64_t bytes) {
    if (M <= 0) return 0;
    if (ft_gemv_amx && W->fmt == FMT_BF16 && !W->seg) {    /* amx_gemv.c, where chosen and AMX runs */
        const int rc = amx_gemv_run(p, W->w, W->w_rs, N, K, x, xt, M, bias, y, ldy, bytes);
        if (rc != -3) return rc;
    }
    size_t sz_xq = (size_t)M * (size_t)x_stride(W->fmt, K), sz_tmp = (size_t)p->n * K * 4;
    uint8_t *buf = scratch(p, (sz_xq + 63) / 64 * 64 + sz_tmp);
    if (!buf) return -2;
    gemv_job L = {*W, N, K, x, xt, M, bias, y, ldy, buf, (float *)(buf + (sz_xq + 63) / 64 * 64), p};
    pool_run_sized(p, gemv_fn, &L, bytes);
    return 0;
}

/* y [M, N] fp32 = x [M, K] (fp32 or bf16) @ W [N, K]^T + bias. Returns 0, or -2 when the
 * scratch memory cannot be allocated. */
int ft_linear_run(void *vp, int fmt, const void *w, int64_t w_rs, const void *s, int64_t s_rs,
                  int N, int K, const void *x, int xt, int64_t M, const float *bias, float *y) {
    const ft_gemv_rows W = {fmt, w, w_rs, s, s_rs, NULL, 0};
    return gemv_run(vp, &W, N, K, x, xt, M, bias, y, N, (int64_t)N * w_rs);
}
