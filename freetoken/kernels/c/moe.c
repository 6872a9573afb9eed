#include "ft_kernels.h"

/* ------------------------------------------------------------------ the MoE job
 * Routed experts straight from the host pool banks (the work split is described in ft_kernels.h). */

typedef struct {
    const ft_desc *d;
    const void *x; int xt; int64_t T;
    float *out;
    int G;              /* groups (distinct experts) */
    const int64_t *g_e; const int32_t *g_start; const int32_t *g_n;
    const int32_t *r_tok; const float *r_w;   /* per slot, sorted by expert */
    const int32_t *r_out;   /* per slot: its row of out (its token's; ft_moe_run_pairs: the pair's) */
    int R;
    uint8_t *xq;        /* T prepared inputs, stride prep_bytes(H) */
    float *hn;          /* R x I natural fp32 */
    uint8_t *hq;        /* R prepared h, stride prep_bytes(I) */
    /* groups of >= GEMM_GROUP_MIN tokens (ggml: ft_ggml_group_min) through the GEMM tiles (gemm_bf16.c) */
    int gm;             /* the tiles' mode, 0: none this call */
    const int32_t *g_blk;   /* first packed block of group g, -1: the dot tiles */
    const int32_t *blk_g;   /* the group of packed block b */
    int nblk;
    const float **xrows, **hrows;   /* per slot: its token's x row, its h row */
    uint16_t *xpk, *hpk;    /* packed x (blocks of blk_bytes(H)), packed h (blk_bytes(I)) */
    float *gtmp;            /* per thread: 3 x (max tokens of a group) x 32 floats */
    uint16_t *gpad;         /* per thread: gemm_pad_elems() bf16 (ggml: the decoded 32 x kpad(max(H, I)) panel after it) */
    int64_t gtmp_n, gpad_n;
} moe_job;

static inline float act_fn(const ft_desc *d, float g, float u) {
    if (d->act == ACT_SILU) return g / (1.f + expf(-g)) * u;
    g = g < d->limit ? g : d->limit;
    u = u < -d->limit ? -d->limit : (u > d->limit ? d->limit : u);
    if (d->act == ACT_SILU_CLAMP) return g / (1.f + expf(-g)) * u;     /* DeepSeek-V4 */
    return (u + 1.f) * (g / (1.f + expf(-g * d->alpha)));
}

typedef struct { moe_job *J; ft_pool *p; } moe_ctx;

/* Rows [n0, n1) (<= 32) of expert matrix wb through the tiles into out (ldo 32): bf16 rows in
 * place; ggml rows (their type at tp) decoded once into the thread's panel first (ggml_tiles.c). */
static void tile_rows(const moe_job *J, const uint8_t *wb, int64_t rs, const uint8_t *tp, int n0, int n1, int K,
                      const uint16_t *xp, int ns, float *out, uint16_t *pad) {
    if (J->d->fmt != FMT_GGML) { gemm_rows(J->gm, wb, rs, n0, n1, K, xp, ns, out, 32, pad, NULL, 0); return; }
    uint16_t *pan = pad + gemm_pad_elems();
    int32_t type;
    memcpy(&type, tp, 4);
    ggml_panel(type, wb, rs, n0, n1, K, pan);
    gemm_rows(J->gm, (const uint8_t *)pan, kpad(K) * 2, 0, n1 - n0, K, xp, ns, out, 32, pad, NULL, 0);
}

/* h[t][j] = act(gate, up) of 32 columns (jb..je) of `nt` tokens from the tiles' outputs (ldo 32):
 * SiLU 16 columns at a time with a vector exp where the build has AVX-512 (the scalar expf loop
 * was a fifth of a 512-token expert group's time), the rest through act_fn. */
static void act_rows(const ft_desc *d, const float *gt, const float *ut, const float *gb, int jb, int je, int nt,
                     float *h, int64_t ldh) {
    const int I = d->I;
    for (int t = 0; t < nt; t++) {
        const float *gr = gt + t * 32, *ur = ut + t * 32;
        float *hr = h + t * ldh;
        int j = jb;
#ifdef FT_AVX512
        if (d->act == ACT_SILU)
            for (; j + 16 <= je; j += 16) {
                __m512 gg = _mm512_loadu_ps(gr + j - jb), uu = _mm512_loadu_ps(ur + j - jb);
                if (gb) { gg = _mm512_add_ps(gg, _mm512_loadu_ps(gb + j)); uu = _mm512_add_ps(uu, _mm512_loadu_ps(gb + I + j)); }
                const __m512 e = exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), gg), _mm512_set1_ps(88.f)));
                _mm512_storeu_ps(hr + j, _mm512_mul_ps(_mm512_div_ps(gg, _mm512_add_ps(e, _mm512_set1_ps(1.f))), uu));
            }
#endif
        for (; j < je; j++) {
            float gg = gr[j - jb], uu = ur[j - jb];
            if (gb) { gg += gb[j]; uu += gb[I + j]; }
            hr[j] = act_fn(d, gg, uu);
        }
    }
}

/* Group g's gate/up over columns [j0, j1) through the GEMM tiles, 32 columns of gate and of up
 * at a time, in chunks of tokens whose packed x stays in L2 while every column block passes
 * (a 512-token group's x is 2 MB at H = 2048: read whole per 32 columns, it came from L3). */
static void tile_gate_up(const moe_job *J, int g, const uint8_t *wb, const uint8_t *ub, int64_t urs, const float *gb,
                         int j0, int j1, float *gt, float *gu_t, uint16_t *pad) {
    const ft_desc *d = J->d;
    const int fmt = d->fmt, H = d->H, I = d->I, s0 = J->g_start[g], ns = J->g_n[g];
    const int64_t e = J->g_e[g], bbH = blk_bytes(H) / 2;
    /* ggml panels are decoded per call: one chunk, so each is decoded once */
    const int cm = fmt == FMT_GGML ? ns : gemm_chunk_tokens(H);
    for (int c0 = 0; c0 < ns; c0 += cm) {
        const int cn = ns - c0 < cm ? ns - c0 : cm;
        const uint16_t *xg = J->xpk + (J->g_blk[g] + c0 / 16) * bbH;
        for (int jb = j0; jb < j1; jb += 32) {
            const int je = jb + 32 < j1 ? jb + 32 : j1;
            tile_rows(J, wb, d->gu_w_rs, scale_row(fmt, d->gu_s, d->gu_s_es, d->gu_s_rs, e, jb), jb, je, H, xg, cn, gt, pad);
            tile_rows(J, ub, urs, scale_row(fmt, d->gu_s, d->gu_s_es, d->gu_s_rs, e, I + jb), jb, je, H, xg, cn, gu_t, pad);
            act_rows(d, gt, gu_t, gb, jb, je, cn, J->hn + (int64_t)(s0 + c0) * I, I);
        }
    }
}

#ifdef FT_BF16DOT
/* The stride between the tokens' prepared rows xp[0..nt) where they are evenly spaced (one token:
 * any), as dot_rows_bf16_pairs takes them; -1 where not (an expert's tokens in routing order). */
static int64_t token_stride(const uint8_t *const *xp, int nt) {
    const int64_t s = nt > 1 ? xp[1] - xp[0] : 0;
    for (int t = 2; t < nt; t++)
        if (xp[t] - xp[t - 1] != s) return -1;
    return s;
}
#endif

static void moe_run_fn(void *a, int tid) {
    moe_ctx *C = a;
    moe_job *J = C->J;
    ft_pool *p = C->p;
    const ft_desc *d = J->d;
    const int H = d->H, I = d->I, fmt = d->fmt, nth = p->active;
    const int64_t xs = prep_bytes(H), hs = prep_bytes(I);
#ifdef FT_BF16DOT
    /* bf16 weights under vdpbf16ps: dense.c's GEMV rows (bwide, 4 lines of the next tile
     * prefetched a step), not btile's one line: medium48's 8 experts of 2048 x 768, one token,
     * one thread, read 19.1 -> 25.8 GB/s of a 29.8 GB/s read probe (same bits: one chain per
     * (row, token) in both) */
    const int bw = fmt == FMT_BF16 && ft_bf16_dot_on;
#else
    const int bw = 0;
#endif

    /* 0. prepare inputs: tokens round-robin */
    float *tmp = J->hn + (int64_t)J->R * I;  /* per-thread row of H floats */
    tmp += (int64_t)tid * H;
    for (int64_t t = tid; t < J->T; t += nth) {
        const float *src;
        if (J->xt == XT_F32) src = (const float *)J->x + t * H;
        else {
            const uint16_t *xb = (const uint16_t *)J->x + t * H;
            for (int k = 0; k < H; k++) tmp[k] = bf16_to_f32(xb[k]);
            src = tmp;
        }
        if (J->gm && !ft_bf16_dot_on) {     /* the tiles' call: every group's x rounded to bf16 alike */
            float *r = J->hn + (int64_t)J->R * I + (int64_t)tid * H;
            if (r != src) memcpy(r, src, (size_t)H * 4);
            for (int k = 0; k < H; k++) r[k] = bf16_to_f32(f32_to_bf16(r[k]));
            src = r;
        }
        prep_range(fmt, src, J->xq + t * xs, H, 0, H);
    }
    const int64_t bbH = blk_bytes(H) / 2, bbI = blk_bytes(I) / 2;
    for (int b = tid; b < J->nblk; b += nth) {       /* the GEMM groups' x, packed */
        const int g = J->blk_g[b], s0 = J->g_start[g];
        gemm_pack(J->xrows + s0, 16 * (b - J->g_blk[g]), J->g_n[g], H, 0, H, J->xpk + b * bbH);
    }
    float *gt = J->gtmp + tid * J->gtmp_n, *gu_t = gt + J->gtmp_n / 3, *dn_t = gu_t + J->gtmp_n / 3;
    uint16_t *pad = J->gpad + tid * J->gpad_n;
    pool_barrier(p);

    /* 1. gate/up + activation over this thread's j range, all experts */
    int j0, j1;
    split(I, 32, nth, tid, &j0, &j1);
    if (j0 < j1) {
        for (int g = 0; g < J->G; g++) {
            const int64_t e = J->g_e[g];
            const int s0 = J->g_start[g], ns = J->g_n[g];
            const uint8_t *wb = d->gu_w + e * d->gu_w_es;
            /* the up rows: rows I.. of the gate's bank, or a bank of their own */
            const uint8_t *ub = d->up_w ? d->up_w + e * d->up_w_es : wb + (int64_t)I * d->gu_w_rs;
            const int64_t urs = d->up_w ? d->up_w_rs : d->gu_w_rs;
            const float *gb = d->gu_b ? d->gu_b + e * 2 * I : NULL;
            if (J->g_blk[g] >= 0) { tile_gate_up(J, g, wb, ub, urs, gb, j0, j1, gt, gu_t, pad); continue; }
            /* blocks of RB rows stay in L2 while every chunk of tokens passes over them */
            for (int jb = j0; jb < j1; jb += RB)
            for (int c = 0; c < ns; c += NTMAX) {
                int nt = ns - c < NTMAX ? ns - c : NTMAX;
                const int je = jb + RB < j1 ? jb + RB : j1;
                const uint8_t *xp[NTMAX];
                for (int t = 0; t < nt; t++) xp[t] = J->xq + (int64_t)J->r_tok[s0 + c + t] * xs;
                /* rows j..j+jr-1 of gate and of up per tile: one token's narrow ggml rows 8 + 8, else two
                   row pairs (the int8 zmm tiles and the vdpbf16ps rows: two pairs for any token count) */
                const int jr = nt == 1 || bw ? (fmt == FMT_GGML && H <= GGML_WIDE_MAX ? GGML_TILE_ROWS / 2 : 2)
                                       : int8_zmm_on(fmt) ? 2 : 1;
                for (int j = jb; j < je; j += jr) {
                    int m = j + jr <= je ? jr : je - j;
                    const uint8_t *wr[GGML_TILE_ROWS], *sr[GGML_TILE_ROWS];
                    float res[GGML_TILE_ROWS][NTMAX];
                    for (int q = 0; q < m; q++) {
                        wr[q] = wb + (int64_t)(j + q) * d->gu_w_rs;
                        sr[q] = scale_row(fmt, d->gu_s, d->gu_s_es, d->gu_s_rs, e, j + q);
                        wr[m + q] = ub + (int64_t)(j + q) * urs;
                        sr[m + q] = scale_row(fmt, d->gu_s, d->gu_s_es, d->gu_s_rs, e, I + j + q);
                    }
                    tl_pf = pf_distance((int64_t)(m < 2 ? m : 2) * d->gu_w_rs, d->gu_w_rs);   /* two rows' tile ahead (the up rows': near enough) */
#ifdef FT_BF16DOT
                    int64_t ts;
                    if (bw && (ts = token_stride(xp, nt)) >= 0)      /* (else btile: the same bits) */
                        dot_rows_bf16_pairs(wr, 2 * m, H, xp[0], ts, nt, &res[0][0], NTMAX, 4);
                    else
#endif
                    dot_tile(fmt, wr, sr, 2 * m, H, xp, nt, res);
                    for (int q = 0; q < m; q++)
                        for (int t = 0; t < nt; t++) {
                            float gg = res[q][t], uu = res[m + q][t];
                            if (gb) { gg += gb[j + q]; uu += gb[I + j + q]; }
                            J->hn[(int64_t)(s0 + c + t) * I + j + q] = act_fn(d, gg, uu);
                        }
                }
            }
        }
        for (int g = 0; g < J->G; g++) {
            const int s0 = J->g_start[g], ns = J->g_n[g];
            if (J->g_blk[g] < 0) {
                for (int s = s0; s < s0 + ns; s++) {
                    float *h = J->hn + (int64_t)s * I;
                    if (J->gm && !ft_bf16_dot_on)       /* rounded as the tiles round h */
                        for (int j = j0; j < j1; j++) h[j] = bf16_to_f32(f32_to_bf16(h[j]));
                    prep_range(fmt, h, J->hq + (int64_t)s * hs, I, j0, j1);
                }
            } else {    /* this thread's columns of the group's h, packed */
                for (int b = 0; b * 16 < ns; b++)
                    gemm_pack(J->hrows + s0, 16 * b, ns, I, j0, j1, J->hpk + (J->g_blk[g] + b) * bbI);
            }
        }
    }
    pool_barrier(p);
    /* 1b. h's per-256 activations (ggml_act.c) need whole vectors: phase 1 split them by columns */
    if (fmt == FMT_GGML && ft_ggml_k256 && I % 256 == 0 && nth > 1) {
        int k = 0;
        for (int g = 0; g < J->G; g++)
            for (int s = J->g_start[g]; J->g_blk[g] < 0 && s < J->g_start[g] + J->g_n[g]; s++, k++)
                if (k % nth == tid) ggml_prep256(J->hn + (int64_t)s * I, J->hq + (int64_t)s * hs, I);
        pool_barrier(p);
    }

    /* 2. down over this thread's output rows, all experts */
    int r0, r1;
    split(H, 16, nth, tid, &r0, &r1);
    for (int g = 0; g < J->G && r0 < r1; g++) {
        const int64_t e = J->g_e[g];
        const int s0 = J->g_start[g], ns = J->g_n[g];
        const uint8_t *wb = d->dn_w + e * d->dn_w_es;
        const float *db = d->dn_b ? d->dn_b + e * H : NULL;
        if (J->g_blk[g] >= 0) {
            const uint16_t *hg = J->hpk + J->g_blk[g] * bbI;
            for (int rb = r0; rb < r1; rb += 32) {
                const int re = rb + 32 < r1 ? rb + 32 : r1;
                tile_rows(J, wb, d->dn_w_rs, scale_row(fmt, d->dn_s, d->dn_s_es, d->dn_s_rs, e, rb),
                          rb, re, I, hg, ns, dn_t, pad);
                for (int t = 0; t < ns; t++) {
                    float *o = J->out + (int64_t)J->r_out[s0 + t] * H;
                    const float wt = J->r_w[s0 + t];
                    for (int r = rb; r < re; r++) o[r] += wt * (db ? dn_t[t * 32 + r - rb] + db[r] : dn_t[t * 32 + r - rb]);
                }
            }
            continue;
        }
        for (int rb = r0; rb < r1; rb += RB)
        for (int c = 0; c < ns; c += NTMAX) {
            int nt = ns - c < NTMAX ? ns - c : NTMAX;
            const int re = rb + RB < r1 ? rb + RB : r1;
            const uint8_t *hp[NTMAX];
            for (int t = 0; t < nt; t++) hp[t] = J->hq + (int64_t)(s0 + c + t) * hs;
            const int rr = fmt == FMT_GGML && nt == 1 && I <= GGML_WIDE_MAX ? GGML_TILE_ROWS : nt == 1 || bw || wide_tiles(fmt) ? 4 : 2;
            for (int r = rb; r < re; r += rr) {
                int m = r + rr <= re ? rr : re - r;
                const uint8_t *wr[GGML_TILE_ROWS], *sr[GGML_TILE_ROWS];
                float y[GGML_TILE_ROWS][NTMAX];
                for (int q = 0; q < m; q++) {
                    wr[q] = wb + (int64_t)(r + q) * d->dn_w_rs;
                    sr[q] = scale_row(fmt, d->dn_s, d->dn_s_es, d->dn_s_rs, e, r + q);
                }
                tl_pf = pf_distance((int64_t)(m < 4 ? m : 4) * d->dn_w_rs, d->dn_w_rs);   /* a tile of four rows ahead */
#ifdef FT_BF16DOT
                if (bw) dot_rows_bf16_pairs(wr, m, I, hp[0], hs, nt, &y[0][0], NTMAX, 4);   /* (rows hs apart) */
                else
#endif
                dot_tile(fmt, wr, sr, m, I, hp, nt, y);
                for (int q = 0; q < m; q++)
                    for (int t = 0; t < nt; t++) {
                        int s = s0 + c + t;
                        J->out[(int64_t)J->r_out[s] * H + r + q] += J->r_w[s] * (db ? y[q][t] + db[r + q] : y[q][t]);
                    }
            }
        }
    }
}

/* The tiles' mode for this call's experts (0: the dot products): bf16 weights under ft_gemm_mode,
 * ggml weights under ft_ggml_tiles (not under llama.cpp's numerics), fp32 inputs, a mode that runs
 * for both of the experts' input widths. */
static int fmt_gemm(const ft_desc *d, int xt) {
    const int m = d->fmt == FMT_BF16 ? ft_gemm_mode : d->fmt == FMT_GGML && !ft_ggml_act_llama ? ft_ggml_tiles : 0;
    return m && xt == XT_F32 && gemm_mode_runs(m, d->H) && gemm_mode_runs(m, d->I) ? m : 0;
}

/* Tokens of one expert from which a tiles call runs it through the tiles, not the dot products
 * (Sapphire Rapids, expert 2048x768, one core: AMX 1.08x the dots at 8 tokens, 4.2x at 64). */
#define GEMM_GROUP_MIN 4

/* r: the order the experts' outputs are summed in (the expert id e itself, or the caller's rank:
 * the disk tier runs experts from cache slots in their flat ids' order, so any slot layout sums
 * as the resident pool does; one rank per expert of a call) */
typedef struct { int64_t r, e; int32_t idx; } route_key;
static int cmp_route(const void *a, const void *b) {
    const route_key *x = a, *y = b;
    if (x->r != y->r) return x->r < y->r ? -1 : 1;
    return x->idx - y->idx;
}

static int moe_run(void *vp, const ft_desc *d, const void *x, int xt, int64_t T, int64_t K,
                   const int64_t *ids, const int64_t *rank, const float *w, float *out, int pairs);

/* Returns the number of distinct experts run (>= 0), -1 on a bad expert id, -2 on allocation failure. */
int ft_moe_run(void *vp, const ft_desc *d, const void *x, int xt, int64_t T, int64_t K,
               const int64_t *ids, const float *w, float *out) {
    return moe_run(vp, d, x, xt, T, K, ids, NULL, w, out, 0);
}

/* ft_moe_run, each token's outputs summed in ascending rank[i] (NULL: ascending ids[i]) */
int ft_moe_run_ranked(void *vp, const ft_desc *d, const void *x, int xt, int64_t T, int64_t K,
                      const int64_t *ids, const int64_t *rank, const float *w, float *out) {
    return moe_run(vp, d, x, xt, T, K, ids, rank, w, out, 0);
}

/* Each routed pair's expert output on its own: out is [T*K, H], row i = expert ids[i] on token
 * i / K, bias included, unweighted (added as 1 * y into out's row, which the caller sets to -0.0:
 * then the row is y exactly). The disk tier runs the experts already in RAM this way while the
 * rest are read, and ft_moe_combine sums the rows as ft_moe_run_ranked would have. */
int ft_moe_run_pairs(void *vp, const ft_desc *d, const void *x, int xt, int64_t T, int64_t K,
                     const int64_t *ids, float *out) {
    return moe_run(vp, d, x, xt, T, K, ids, NULL, NULL, out, 1);
}

/* out[t] += w[i] * y[i] over token t's pairs i (ids[i] >= 0) in ascending rank[i], then i: the
 * kernel's own sum (moe_run_fn's `out += w * y`, the same expression, so the same rounding and
 * contraction), over rows ft_moe_run_pairs made. */
void ft_moe_combine(int64_t T, int64_t K, int64_t H, const float *y, const int64_t *ids, const int64_t *rank,
                    const float *w, float *out) {
    for (int64_t t = 0; t < T; t++) {
        int64_t ord[K > 0 ? K : 1];
        int n = 0;
        for (int64_t k = 0; k < K; k++) {
            const int64_t i = t * K + k;
            if (ids[i] < 0) continue;
            int j = n++;
            while (j > 0 && rank[ord[j - 1]] > rank[i]) { ord[j] = ord[j - 1]; j--; }
            ord[j] = i;
        }
        float *o = out + t * H;
        for (int j = 0; j < n; j++) {
            const float wt = w[ord[j]];
            const float *yr = y + ord[j] * H;
            for (int64_t r = 0; r < H; r++) o[r] += wt * yr[r];
        }
    }
}

void ft_route_topk(const float *logits, int64_t T, int E, int k, int norm, int after, int64_t *ids, float *w);

/* A decode step's MoE block after its router GEMV in one call: ft_route_topk of the logits
 * [T, E] into ids / w ([T, k]: the layer's expert numbers, best first), flat = ids + offset (the
 * layer's first expert in this executor's banks), out [T, H] set to zero, then ft_moe_run of
 * the flat ids: the bits of the five-call path (route, ids + offset, zeros, run) it replaces,
 * where each torch op between the kernels cost ~20-40 us of CPU on a decode step (cProfile,
 * medium48, Zen 1). Returns what ft_moe_run returns. */
int ft_moe_decode(void *vp, const ft_desc *d, const float *logits, int E, int k, int norm, int after,
                  int64_t offset, const void *x, int xt, int64_t T, int64_t *ids, int64_t *flat, float *w,
                  float *out) {
    ft_route_topk(logits, T, E, k, norm, after, ids, w);
    for (int64_t i = 0; i < T * k; i++) flat[i] = ids[i] + offset;
    memset(out, 0, sizeof(float) * (size_t)(T * d->H));
    return moe_run(vp, d, x, xt, T, k, flat, NULL, w, out, 0);
}

static int moe_run(void *vp, const ft_desc *d, const void *x, int xt, int64_t T, int64_t K,
                   const int64_t *ids, const int64_t *rank, const float *w, float *out, int pairs) {
    ft_pool *p = vp;
    const int64_t RK = T * K;
    route_key *keys = malloc(sizeof(route_key) * (size_t)(RK ? RK : 1));
    if (!keys) return -2;
    int R = 0;
    for (int64_t i = 0; i < RK; i++) {
        if (ids[i] < 0) continue;
        if (ids[i] >= d->n_experts) { free(keys); return -1; }
        keys[R].e = ids[i]; keys[R].r = rank ? rank[i] : ids[i]; keys[R].idx = (int32_t)i; R++;
    }
    if (R == 0) { free(keys); return 0; }
    if (R > 1) qsort(keys, (size_t)R, sizeof *keys, cmp_route);

    const int H = d->H, I = d->I;
    /* a call of >= ft_gemm_min tokens takes the GEMM tiles (bf16 experts, fp32 inputs): its groups of
     * >= GEMM_GROUP_MIN tokens run through them, the rest through the dot products, with x and h
     * rounded to bf16 in every group alike, so the answer depends on the call, not on how its
     * tokens spread over the experts (the torch executors round the same calls: numerics.py) */
    const int gm = T >= ft_gemm_min ? fmt_gemm(d, xt) : 0;
    const int gmin = d->fmt == FMT_GGML ? ft_ggml_group_min : GEMM_GROUP_MIN;
    int nblk = 0, max_ns = 0, G = 0;
    for (int i = 0, n = 0; i < R; i++) {
        n++;
        if (i == R - 1 || keys[i + 1].e != keys[i].e) {
            G++;
            if (gm && n >= gmin) { nblk += (n + 15) / 16; max_ns = n > max_ns ? n : max_ns; }
            n = 0;
        }
    }
    size_t sz_meta = (size_t)R * (8 + 4 + 4 + 4 + 4 + 4) + (size_t)G * 4 + (size_t)nblk * 4 + (size_t)R * 2 * sizeof(float *) + 8;
    size_t sz_xq = (size_t)T * (size_t)prep_bytes(H);
    size_t sz_hn = ((size_t)R * I + (size_t)p->n * H) * 4;
    size_t sz_hq = (size_t)R * (size_t)prep_bytes(I);
    size_t sz_pk = (size_t)nblk * (size_t)(blk_bytes(H) + blk_bytes(I));
    const int KM = H > I ? H : I;
    int64_t gtmp_n = (int64_t)3 * max_ns * 32;
    int64_t gpad_n = nblk ? gemm_pad_elems() + (d->fmt == FMT_GGML ? 32 * kpad(KM) : 0) : 0;
    size_t sz_gt = (size_t)p->n * (size_t)(gtmp_n * 4 + gpad_n * 2);
    size_t a64 = 64;
    #define RUP(v) (((v) + a64 - 1) / a64 * a64)
    uint8_t *buf = scratch(p, RUP(sz_meta) + RUP(sz_xq) + RUP(sz_hn) + RUP(sz_hq) + RUP(sz_pk) + RUP(sz_gt));
    if (!buf) { free(keys); return -2; }
    int64_t *g_e = (int64_t *)buf;
    int32_t *g_start = (int32_t *)(g_e + R), *g_n = g_start + R, *r_tok = g_n + R;
    int32_t *r_out = r_tok + R;
    float *r_w = (float *)(r_out + R);
    const float **xrows = (const float **)(r_w + R + (R & 1)), **hrows = xrows + R;
    int32_t *g_blk = (int32_t *)(hrows + R), *blk_g = g_blk + G;
    uint8_t *xq = buf + RUP(sz_meta);
    float *hn = (float *)(xq + RUP(sz_xq));
    uint8_t *hq = (uint8_t *)hn + RUP(sz_hn);
    uint16_t *xpk = (uint16_t *)(hq + RUP(sz_hq)), *hpk = xpk + (size_t)nblk * blk_bytes(H) / 2;
    float *gtmp = (float *)((uint8_t *)xpk + RUP(sz_pk));
    uint16_t *gpad = (uint16_t *)(gtmp + p->n * gtmp_n);

    G = 0;
    for (int i = 0, b = 0; i < R; i++) {
        if (i == 0 || keys[i].e != keys[i - 1].e) { g_e[G] = keys[i].e; g_start[G] = i; g_n[G] = 0; G++; }
        g_n[G - 1]++;
        r_tok[i] = (int32_t)(keys[i].idx / K);
        r_out[i] = pairs ? keys[i].idx : r_tok[i];
        r_w[i] = pairs ? 1.f : w[keys[i].idx];
        xrows[i] = (const float *)x + (int64_t)r_tok[i] * H;
        hrows[i] = hn + (int64_t)i * I;
        if (i == R - 1 || keys[i + 1].e != keys[i].e) {
            const int g = G - 1, n = g_n[g];
            g_blk[g] = -1;
            if (gm && n >= gmin) {
                g_blk[g] = b;
                for (int k = 0; k < (n + 15) / 16; k++) blk_g[b++] = g;
            }
        }
    }
    free(keys);

    moe_job J = {d, x, xt, T, out, G, g_e, g_start, g_n, r_tok, r_w, r_out, R, xq, hn, hq,
                 gm, g_blk, blk_g, nblk, xrows, hrows, xpk, hpk, gtmp, gpad, gtmp_n, gpad_n};
    moe_ctx C = {&J, p};
    pool_run_sized(p, moe_run_fn, &C, (int64_t)G * (d->gu_w_es + (d->up_w ? d->up_w_es : 0) + d->dn_w_es));
    return G;
}
