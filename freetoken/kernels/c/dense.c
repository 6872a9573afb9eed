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

static void gemv_fn(void *a, int tid) {
    gemv_job *L = a;
    const int fmt = L->W.fmt, N = L->N, K = L->K, nth = L->p->active;
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
    split_rows(&L->W, N, nth, tid, &r0, &r1);
    for (int rb = r0; rb < r1; rb += RB)
    for (int64_t c = 0; c < L->M; c += NTMAX) {
        const int nt = L->M - c < NTMAX ? (int)(L->M - c) : NTMAX;
        const int re = rb + RB < r1 ? rb + RB : r1;
        const uint8_t *xp[NTMAX];
        for (int t = 0; t < nt; t++) xp[t] = L->xq + (c + t) * xs;
        const int rr = nt == 1 || wide_tiles(fmt) ? 4 : 2;
        for (int r = rb; r < re; r += rr) {
            const int m = r + rr <= re ? rr : re - r;
            const uint8_t *wr[4], *sr[4];
            float res[4][NTMAX];
            int64_t rs = 0;
            for (int q = 0; q < m; q++) {
                const int64_t s = row_at(&L->W, r + q, &wr[q], &sr[q]);
                if (q == 0) rs = s;
            }
            tl_pf = pf_distance((int64_t)m * rs, rs);
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
    size_t sz_xq = (size_t)M * (size_t)prep_bytes(K), sz_tmp = (size_t)p->n * K * 4;
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
