/* The decode GEMV over bf16 weights on AMX tiles: y[M, N] = x[M, K] @ W[N, K]^T (+ bias) for the
 * 1..65 rows of a decode or verify step, x rounded to bf16 once per call (llama.cpp's bf16 path),
 * products summed in fp32.
 *
 * Why: the dot tiles (dots.c, bf16dot.c) widen or pair each weight with each token in vector
 * registers, so beyond one token the GEMV is compute bound (a verify of k drafts cost ~1 + 0.12 k
 * plain steps on the medium dense model). Here 16 weight rows are the A tile loaded straight
 * from their row-major layout (tileloadd, stride = the row's bytes: no repack of the weights),
 * x^T the B tiles (gemm_bf16.c's packed blocks of 16 tokens), C^T [16 rows x 16 tokens] fp32:
 * one pass over the weights serves up to 16 tokens per tile product (up to 5 blocks, 80
 * tokens, per pass), so the weights stream from memory once per call and a verify of up to ~16
 * rows costs about a plain step.
 *
 * Batch invariance: every output is one C element accumulated over K in the same steps of 32
 * columns (the K tail zero-padded), whatever M and the token's column in its tile: a row's bits
 * do not depend on the other rows of the call (tests/layers/test_amx_gemv.py).
 *
 * Rows split between threads in multiples of 16; a last panel of fewer than 16 rows is computed
 * as the 16 rows ending at N (only its own rows written), a matrix of fewer than 16 rows from a
 * zero-padded copy. */
#include "ft_kernels.h"

int ft_gemv_amx;

/* Switch the decode GEMV of bf16 weights to the AMX tiles (kernels/choices.py's choice); returns
 * 1 when on (0 where this build or the OS does not run AMX). */
int ft_set_gemv_amx(int on) {
    ft_gemv_amx = on && ft_amx_ready();
    return ft_gemv_amx;
}

#ifdef FT_AMX
#define GA_NB 5     /* token blocks per pass: 5 C tiles + 1 A + 2 B (alternating) of the 8 */
#define GA_PF 8     /* K steps (64 bytes a row) ahead the weights are asked of L2: a tile's 16
                     * rows are a page apart and share one L1 set, so L1 would evict them early */

typedef struct {
    const uint8_t *w; int64_t w_rs; int N, K, Nw;   /* Nw: rows of w (>= 16) */
    const void *x; int xt; int M;
    const float *bias; float *y; int64_t ldy;
    uint16_t *xp; const float **rows; uint16_t *pad;
    ft_pool *p;
} ga_job;

/* Steps [0, K/32) and the K tail of one panel of 16 rows (at w) for NB blocks of tokens (xb:
 * the first block's step 0); the C tiles 0..NB-1 are left holding the sums. */
FORCE_INLINE void ga_panel(const uint8_t *w, int64_t w_rs, int K, const uint16_t *xb, int64_t bb,
                           const uint8_t *next, const int NB) {
    static __thread uint16_t tail[512] __attribute__((aligned(64)));
    const int full = K / 32, kt = K - 32 * full;
    _tile_zero(0);
    if (NB > 1) _tile_zero(1);
    if (NB > 2) _tile_zero(2);
    if (NB > 3) _tile_zero(3);
    if (NB > 4) _tile_zero(4);
    for (int k = 0; k <= full; k++) {
        const uint16_t *xk = xb + 512 * (int64_t)k;
        if (k < full) {
            const int f = k + GA_PF;
            const uint8_t *pf = f < full ? w + 64 * (int64_t)f : next + 64 * (int64_t)(f - full);
            for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(pf + r * w_rs), _MM_HINT_T1);
            _tile_loadd(5, w + 64 * (int64_t)k, w_rs);
        } else {
            if (!kt) break;
            const __mmask32 m = (__mmask32)((1ull << kt) - 1);   /* the last K % 32 columns, zero-padded */
            for (int r = 0; r < 16; r++)
                _mm512_store_si512(tail + 32 * r, _mm512_maskz_loadu_epi16(m, w + r * w_rs + 64 * (int64_t)full));
            _tile_loadd(5, tail, 64);
        }
        _tile_loadd(6, xk, 64);
        _tile_dpbf16ps(0, 5, 6);
        if (NB > 1) { _tile_loadd(7, xk + bb, 64); _tile_dpbf16ps(1, 5, 7); }
        if (NB > 2) { _tile_loadd(6, xk + 2 * bb, 64); _tile_dpbf16ps(2, 5, 6); }
        if (NB > 3) { _tile_loadd(7, xk + 3 * bb, 64); _tile_dpbf16ps(3, 5, 7); }
        if (NB > 4) { _tile_loadd(6, xk + 4 * bb, 64); _tile_dpbf16ps(4, 5, 6); }
    }
}

/* The C tiles of one panel (rows from `src`) -> y rows [r0, r1) of tokens [m0, m0 + 16 nb). */
static void ga_put(const ga_job *J, int nb, int src, int r0, int r1, int m0) {
    static __thread float cb[GA_NB][256] __attribute__((aligned(64)));
    _tile_stored(0, cb[0], 64);
    if (nb > 1) _tile_stored(1, cb[1], 64);
    if (nb > 2) _tile_stored(2, cb[2], 64);
    if (nb > 3) _tile_stored(3, cb[3], 64);
    if (nb > 4) _tile_stored(4, cb[4], 64);
    const int mt = J->M - m0 < 16 * nb ? J->M - m0 : 16 * nb;
    for (int t = 0; t < mt; t++) {
        const float *c = cb[t / 16] + t % 16;
        float *o = J->y + (int64_t)(m0 + t) * J->ldy;
        for (int r = r0; r < r1; r++) o[r] = c[16 * (r - src)] + (J->bias ? J->bias[r] : 0.f);
    }
}

/* Columns [c0, c1) of every block of x -> the packed blocks (this thread's share). */
static void ga_pack(const ga_job *J, int c0, int c1) {
    const int nblk = (J->M + 15) / 16;
    const int64_t bb = blk_bytes(J->K) / 2;
    for (int b = 0; b < nblk; b++) {
        uint16_t *dst = J->xp + b * bb;
        if (J->xt == XT_F32) { gemm_pack(J->rows, 16 * b, J->M, J->K, c0, c1, dst); continue; }
        const int64_t p1 = c1 == J->K ? kpad(J->K) / 2 : c1 / 2;
        memset(dst + (int64_t)c0 / 2 * 32, 0, (size_t)(p1 - c0 / 2) * 64);
        for (int i = 0; i < 16 && 16 * b + i < J->M; i++) {
            const uint16_t *xr = (const uint16_t *)J->x + (int64_t)(16 * b + i) * J->K;
            for (int k = c0; k < c1; k++) dst[(int64_t)(k >> 1) * 32 + 2 * i + (k & 1)] = xr[k];
        }
    }
}

static void ga_fn(void *a, int tid) {
    ga_job *J = a;
    const int nth = J->p->active;
    int c0, c1;
    split(J->K, 32, nth, tid, &c0, &c1);
    if (c0 < c1) ga_pack(J, c0, c1);
    if (J->pad && tid == 0) {           /* fewer than 16 rows: a zero-padded copy of 16 */
        const int64_t rs = 2 * kpad(J->K);
        memset(J->pad, 0, (size_t)(16 * rs));
        for (int r = 0; r < J->N; r++) memcpy((uint8_t *)J->pad + r * rs, J->w + r * J->w_rs, 2 * (size_t)J->K);
    }
    pool_barrier(J->p);
    const uint8_t *w = J->pad ? (const uint8_t *)J->pad : J->w;
    const int64_t w_rs = J->pad ? 2 * kpad(J->K) : J->w_rs, bb = blk_bytes(J->K) / 2;
    int r0, r1;
    split(J->N, 16, nth, tid, &r0, &r1);
    if (r0 >= r1) return;
    amx_config();
    for (int n = r0; n < r1; n += 16) {
        const int src = n + 16 <= J->Nw ? n : J->Nw - 16, e = n + 16 < r1 ? n + 16 : r1;
        const uint8_t *wp = w + src * w_rs, *next = wp + 16 * w_rs;
        for (int m0 = 0; m0 < J->M; m0 += 16 * GA_NB) {
            const int nb = (J->M - m0 + 15) / 16 < GA_NB ? (J->M - m0 + 15) / 16 : GA_NB;
            const uint16_t *xb = J->xp + (m0 / 16) * bb;
            switch (nb) {
            case 1: ga_panel(wp, w_rs, J->K, xb, bb, next, 1); break;
            case 2: ga_panel(wp, w_rs, J->K, xb, bb, next, 2); break;
            case 3: ga_panel(wp, w_rs, J->K, xb, bb, next, 3); break;
            case 4: ga_panel(wp, w_rs, J->K, xb, bb, next, 4); break;
            default: ga_panel(wp, w_rs, J->K, xb, bb, next, 5); break;
            }
            ga_put(J, nb, src, n, e, m0);
        }
    }
    _tile_release();
}
#endif

/* y [M, ldy] = x [M, K] (XT_F32 / XT_BF16) @ W^T + bias over bf16 rows w_rs bytes apart; `bytes`
 * of weights decide whether the pool runs it on one thread. 0; -2 when the scratch cannot be
 * allocated; -3 where AMX does not run (the caller takes the dot tiles). */
int amx_gemv_run(ft_pool *p, const uint8_t *w, int64_t w_rs, int N, int K, const void *x, int xt, int64_t M,
                 const float *bias, float *y, int64_t ldy, int64_t bytes) {
#ifdef FT_AMX
    if (!ft_amx_ready()) return -3;
    if (M <= 0 || N <= 0) return 0;
    const int nblk = (int)((M + 15) / 16);
    const size_t sz_xp = (size_t)nblk * (size_t)blk_bytes(K), sz_rows = ((size_t)M * sizeof(float *) + 63) / 64 * 64;
    const size_t sz_pad = N < 16 ? (size_t)32 * (size_t)kpad(K) : 0;
    uint8_t *buf = scratch(p, sz_xp + sz_rows + sz_pad);
    if (!buf) return -2;
    const float **rows = (const float **)(buf + sz_xp);
    if (xt == XT_F32)
        for (int64_t m = 0; m < M; m++) rows[m] = (const float *)x + m * K;
    ga_job J = {w, w_rs, N, K, N < 16 ? 16 : N, x, xt, (int)M, bias, y, ldy, (uint16_t *)buf, rows,
                sz_pad ? (uint16_t *)(buf + sz_xp + sz_rows) : NULL, p};
    pool_run_sized(p, ga_fn, &J, bytes);
    return 0;
#else
    (void)p; (void)w; (void)w_rs; (void)N; (void)K; (void)x; (void)xt; (void)M; (void)bias; (void)y; (void)ldy;
    (void)bytes;
    return -3;
#endif
}
