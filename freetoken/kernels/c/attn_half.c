#include <string.h>
#include <time.h>
#include "ft_kernels.h"

/* ------------------------------------------------------------------ a decode row's attention half
 * ft_attn_half: one decode row through a decoder layer's attention half, input RMSNorm -> qkv
 * GEMV -> q/k norms + rope -> K/V into the cache -> decode attention -> o GEMV -> residual add
 * and post-attention RMSNorm (-> the MoE router's GEMV of the normed row, where given), in one
 * call. Each stage calls the very function the separate calls
 * run (ft_rms_norm, ft_linear_run or ft_ggml_linear_run, ft_norm_rope_qk, ft_kv_write,
 * ft_decode_attention, ft_add_rms_norm; other files, so no inlined copy rounds another way), in
 * the same order on the same operands: the bits of the seven calls. What it saves is the Python
 * between them (checks, fresh tensors, ~40 small calls a layer). */

void ft_rms_norm(const float *x, const float *w, int64_t rows, int n, float eps, float *out);
int ft_linear_run(void *vp, int fmt, const void *w, int64_t w_rs, const void *s, int64_t s_rs,
                  int N, int K, const void *x, int xt, int64_t M, const float *bias, float *y);
int ft_ggml_linear_run(void *vp, const ft_gseg *seg, int nseg, int K, const void *x, int xt, int64_t M,
                       const float *bias, float *y, int64_t ldy);
int ft_norm_rope_qk(const float *qkv, int64_t rs, int64_t T, int heads, int kv_heads, int D, int rot,
                    const float *qw, float q_eps, const float *kw, float k_eps, const float *cos, const float *sin,
                    float *out);
int ft_kv_write(const float *k, int64_t ks, const float *v, int64_t vs, int64_t n, int64_t row,
                const int64_t *slots, int64_t num_slots, void *kc, void *vc, int bf16);
int ft_decode_attention(void *vp, const float *q, int S, int Hq, int Hkv, int D, const void *k, const void *v,
                        int kvt, const int64_t *slots, int64_t kmax, const int64_t *nkeys, float scale,
                        const float *sinks, float *out);
void ft_add_rms_norm(const float *x, const float *a, const float *w, int64_t rows, int n, float eps, float *h,
                     float *out);

/* A dense layer as its decode GEMV takes it: kind 0 ft_linear_run's (fmt, w, w_rs, s, s_rs),
 * kind 1 ft_ggml_linear_run's segments; N outputs, K inputs, bias or NULL. (All 8-byte fields:
 * the Python mirror, layers/attention/decode_half.py, lays them out the same.) */
typedef struct {
    int64_t kind, fmt;
    const void *w; int64_t w_rs; const void *s; int64_t s_rs;
    const ft_gseg *segs; int64_t nseg;
    int64_t N, K;
    const float *bias;
} ft_dense_ref;

/* One layer's weights, sizes and scratch rows (xn [hidden], qkv [qkv.N], qk [(heads + kv_heads)
 * * D], att [heads * D], o [hidden]; logits [router.N], router.N = 0: no router); sinks [heads]
 * (gpt-oss: one more logit a head whose mass is dropped) or NULL; eps and scale as doubles,
 * narrowed to float as ctypes narrows the separate calls' arguments. */
typedef struct {
    ft_dense_ref qkv, o, router;
    const float *in_w, *post_w, *qw, *kw, *sinks;
    double in_eps, post_eps, q_eps, k_eps, scale;
    int64_t hidden, heads, kv_heads, D, rot;
    float *xn, *qkv_out, *qk, *att, *o_out, *logits;
} ft_attn_layer;

/* y [M][N] = the layer's GEMV of x [M][K] (fp32 rows), the call a `Linear` of M rows makes */
static int dense_run(void *pool, const ft_dense_ref *L, const float *x, int64_t M, float *y) {
    if (L->kind == 0)
        return ft_linear_run(pool, (int)L->fmt, L->w, L->w_rs, L->s, L->s_rs, (int)L->N, (int)L->K, x, 0, M, L->bias, y)
               ? -2 : 0;
    int rc = ft_ggml_linear_run(pool, L->segs, (int)L->nseg, (int)L->K, x, 0, M, L->bias, y, L->N);
    return rc == -2 ? -2 : rc != 0 ? -3 : 0;
}

/* T rows' scratch (ft_attn_half_rows): xn [T][hidden], qkv_out [T][qkv.N], qk [T][(heads +
 * kv_heads) * D], q [T][heads * D] (the queries packed: ft_decode_attention reads [T][heads][D]),
 * att [T][heads * D], o_out [T][hidden]. (All pointers: the Python mirror lays them out the same.) */
typedef struct {
    float *xn, *qkv_out, *qk, *q, *att, *o_out;
} ft_rows_scratch;

/* The attention half of T rows x [T][hidden] on scratch S: the calls `ft_attn_half` makes, each
 * on all T rows (the calls a verify's T rows make from Python: `Linear` of T rows, `norm_rope_qk`,
 * `KVCache.write`, `verify_attention`'s one `ft_decode_attention` of T one-query rows, row t
 * reading key_slots[t][0 .. nkeys[t]), `add_rms_norm`), no router. */
static int half_rows(void *pool, const ft_attn_layer *L, int64_t T, const ft_rows_scratch *S, const float *x,
                     const float *cos, const float *sin, const int64_t *slots, int64_t num_slots, void *kc, void *vc,
                     int kvt, const int64_t *key_slots, int64_t kmax, const int64_t *nkeys, float *h, float *normed,
                     double *att_seconds) {
    const int H = (int)L->heads, G = (int)L->kv_heads, D = (int)L->D;
    const int64_t qk_rs = (int64_t)(H + G) * D;
    ft_rms_norm(x, L->in_w, T, (int)L->hidden, (float)L->in_eps, S->xn);
    int rc = dense_run(pool, &L->qkv, S->xn, T, S->qkv_out);
    if (rc) return rc;
    if (ft_norm_rope_qk(S->qkv_out, L->qkv.N, T, H, G, D, (int)L->rot, L->qw, (float)L->q_eps, L->kw,
                        (float)L->k_eps, cos, sin, S->qk))
        return -2;
    if (ft_kv_write(S->qk + (int64_t)H * D, qk_rs, S->qkv_out + (int64_t)(H + G) * D, L->qkv.N, T, (int64_t)G * D,
                    slots, num_slots, kc, vc, kvt))
        return -1;
    const float *q = S->qk;         /* one row: its queries lead its qk row */
    if (T > 1) {
        for (int64_t t = 0; t < T; t++) memcpy(S->q + t * H * D, S->qk + t * qk_rs, sizeof(float) * H * D);
        q = S->q;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = ft_decode_attention(pool, q, (int)T, H, G, D, kc, vc, kvt, key_slots, kmax, nkeys, (float)L->scale, L->sinks,
                             S->att);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *att_seconds += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (rc) return -2;
    rc = dense_run(pool, &L->o, S->att, T, S->o_out);
    if (rc) return rc;
    ft_add_rms_norm(x, S->o_out, L->post_w, T, (int)L->hidden, (float)L->post_eps, h, normed);
    return 0;
}

/* x [hidden] -> h = x + o(attention) and normed = post_norm(h), both [hidden]; the row's K/V go
 * to cache slot *slot (kc/vc: a paged cache, or a sliding-window layer's ring of one sequence,
 * whose key_slots are then the ring rows of the window's positions); with a router, its logits of normed into L->logits. att_seconds += the decode attention's wall time (spec/price.py's prior).
 * Returns 0; -1 a KV slot outside [0, num_slots) (nothing written); -2 a kernel could not
 * allocate its scratch; -3 a ggml layer's type was refused. */
int ft_attn_half(void *pool, const ft_attn_layer *L, const float *x, const float *cos, const float *sin,
                 const int64_t *slot, int64_t num_slots, void *kc, void *vc, int kvt,
                 const int64_t *key_slots, int64_t kmax, const int64_t *nkeys, float *h, float *normed,
                 double *att_seconds) {
    const ft_rows_scratch S = {L->xn, L->qkv_out, L->qk, NULL, L->att, L->o_out};
    const int rc = half_rows(pool, L, 1, &S, x, cos, sin, slot, num_slots, kc, vc, kvt, key_slots, kmax, nkeys, h,
                             normed, att_seconds);
    if (rc) return rc;
    return L->router.N ? dense_run(pool, &L->router, normed, 1, L->logits) : 0;
}

/* ------------------------------------------------------------------ a verify's rows' attention half
 * ft_attn_half_rows: T (>= 1) rows through the attention half in one call (a verify of T - 1
 * drafts, or a short chunk of one sequence): ft_attn_half's calls on all T rows at once, on T rows'
 * scratch S, without the router (the caller's MoE block routes its rows); rows t's K/V to cache
 * slot slots[t], its attention over key_slots[t * kmax ..] (nkeys[t] keys). Returns as
 * ft_attn_half. What it saves is the Python between the calls (~0.1 ms a layer of a verify). */
int ft_attn_half_rows(void *pool, const ft_attn_layer *L, int64_t T, const ft_rows_scratch *S, const float *x,
                      const float *cos, const float *sin, const int64_t *slots, int64_t num_slots, void *kc, void *vc,
                      int kvt, const int64_t *key_slots, int64_t kmax, const int64_t *nkeys, float *h, float *normed,
                      double *att_seconds) {
    return half_rows(pool, L, T, S, x, cos, sin, slots, num_slots, kc, vc, kvt, key_slots, kmax, nkeys, h, normed,
                     att_seconds);
}

/* ------------------------------------------------------------------ a decode row's MoE block + residual
 * ft_moe_decode_add: ft_moe_decode (moe.c: top-k of the router logits, the experts into out), then
 * sum = residual + out, the decoder layer's residual add (one fp32 add an element, the bits of
 * torch's `h + out`): the block's output without a torch op (an add and a fresh tensor, ~20-50
 * us of CPU each on a medium model's step, their code cold after the kernels). */
int ft_moe_decode(void *vp, const ft_desc *d, const float *logits, int E, int k, int norm, int after,
                  int64_t offset, const void *x, int xt, int64_t T, int64_t *ids, int64_t *flat, float *w,
                  float *out);

int ft_moe_decode_add(void *vp, const ft_desc *d, const float *logits, int E, int k, int norm, int after,
                      int64_t offset, const void *x, int xt, int64_t T, int64_t *ids, int64_t *flat, float *w,
                      float *out, const float *residual, float *sum) {
    const int rc = ft_moe_decode(vp, d, logits, E, k, norm, after, offset, x, xt, T, ids, flat, w, out);
    if (rc < 0) return rc;
    for (int64_t i = 0; i < T * d->H; i++) sum[i] = residual[i] + out[i];
    return rc;
}

/* ------------------------------------------------------------------ a decode row's MoE block, counted
 * ft_moe_row: ft_moe_decode_add of one row (T = 1), then one count per distinct expert it ran in
 * counts[id] (the layer's per-expert counters, int64 [E]; NULL: none), so a decode step reads no
 * ids back into Python for the expert-memory counters (experts/execution/decode_row.py). Returns
 * as ft_moe_decode_add: the distinct experts run, < 0 on an error (nothing counted). */
int ft_moe_row(void *vp, const ft_desc *d, const float *logits, int E, int k, int norm, int after, int64_t offset,
               const void *x, int xt, int64_t *ids, int64_t *flat, float *w, float *out, const float *residual,
               float *sum, int64_t *counts) {
    const int rc = ft_moe_decode_add(vp, d, logits, E, k, norm, after, offset, x, xt, 1, ids, flat, w, out,
                                     residual, sum);
    if (rc < 0 || !counts) return rc;
    for (int i = 0; i < k; i++) {
        int seen = ids[i] < 0 || ids[i] >= E;
        for (int j = 0; j < i && !seen; j++) seen = ids[j] == ids[i];
        if (!seen) counts[ids[i]]++;
    }
    return rc;
}
