/* Causal prefill attention on AMX bf16 tiles, flash-style: Q x K^T and P x V as TDPBF16PS tile
 * products, the online softmax (fp32 running max and sum) in AVX-512 between them. Without AMX
 * (AVX512-BF16, e.g. Zen 4/5) the same walk with each tile product as vdpbf16ps (pv_*).
 *
 * Why: torch's CPU flash attention in bf16 ran at 7-8% of the AMX peak, 23-37% of a 4096-token
 * prefill (docs/benchmarks.md, "where a 4096-token prefill goes"). Here:
 *  - K and V of every KV head are re-laid once per call into the B tiles' pair layout (K: 16 keys
 *    x 16 column pairs per tile, V: 16 columns x 16 key pairs), so no block is re-laid per query
 *    block;
 *  - the G query heads sharing a KV head are folded into the A tiles' rows (row u = token u / G,
 *    head u % G), so one K/V tile serves a whole group, and 32 rows span only 32 / G tokens: the
 *    causal diagonal cuts few keys;
 *  - key blocks past a row block's last query are never touched (causal skip);
 *  - an item is (KV head, block of 32 rows), handed out head by head, heaviest first, by an atomic
 *    counter.
 *
 * Numerics as torch's bf16 flash kernel: bf16 q/k/v, scores exact products summed in fp32, the
 * softmax in fp32 (exp2 by a degree-5 polynomial, ~2e-7 relative), the numerators rounded to bf16
 * for P x V, the sums and the output in fp32. The queries sit at the last nq of the nk positions
 * (a chunk continuing a cached prefix sees the prefix whole and itself causally).
 *
 * gpt-oss (ft_prefill_attention_sinks): a learned sink logit per query head joins each row's softmax
 * and its mass is dropped (the row starts with max = the sink, sum = 1), and a sliding window keeps
 * only the last `window` keys of each query: key blocks wholly before a row block's window are
 * never touched, the rest masked per row. */
#include "ft_kernels.h"

enum { PA_OFF = 0, PA_AMX = 1, PA_VDP = 2 };
int ft_prefill_att_mode;     /* PA_*; switches.c reads it too */

/* Switch causal prefill attention to the library's kernel (kernels/choices.py's choice): 1 the AMX
 * tiles, 2 the same walk with its tile products as vdpbf16ps (AVX512-BF16, e.g. Zen 4/5 without
 * AMX), 0 off (torch's kernel). Returns the mode in effect (0 where this build or the OS does not
 * run it). */
int ft_set_prefill_att(int mode) {
    int ok = 0;
#ifdef FT_AMX
    ok |= mode == PA_AMX && ft_amx_ready();
#endif
#ifdef FT_BF16DOT
    ok |= mode == PA_VDP;
#endif
    ft_prefill_att_mode = ok ? mode : PA_OFF;
    return ft_prefill_att_mode;
}
#if defined(FT_AMX) || defined(FT_BF16DOT)
#define PA_KERNEL 1
#endif

#ifdef PA_KERNEL
#define PA_ROWS 32      /* A rows of an item: two tiles of 16 */
#define PA_KB 128        /* keys per softmax step: 2 x 2 C tiles of scores, then P x V over 2 pair steps */

typedef struct {
    const uint16_t *q; int64_t q_hs, q_ts;
    const uint16_t *k; int64_t k_hs, k_ts;
    const uint16_t *v; int64_t v_hs, v_ts;
    float *out; int64_t o_hs, o_ts;
    int nq, Hq, Hkv, D, G;
    int64_t nk, nkp, past;
    float scale2;               /* scale * log2(e): scores in base-2 units */
    const float *sinks;         /* [Hq] sink logits (natural units), or NULL */
    int64_t window;             /* keys a query sees, itself included (nk + 1: no window) */
    uint16_t *kp, *vp;          /* per KV head: nkp * D bf16 each */
    uint8_t *ws; int64_t ws_stride;
    int items, rblocks;
    _Atomic int next;
    ft_pool *p;
} pa_job;

/* 16 keys x 32 columns (key rows at k + i * ts; rows past nb zero) -> one B tile [16 pairs][16 keys x 2]. */
static void pa_pack_k(const uint16_t *k, int64_t ts, int64_t nb, uint16_t *dst) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = i < nb ? _mm512_loadu_si512(k + i * ts) : _mm512_setzero_si512();
    t16x16(r, dst);
}

/* 32 keys x 32 columns of V -> two B tiles [16 key pairs][16 columns x 2] (columns c, c + 16). */
static void pa_pack_v(const uint16_t *v, int64_t ts, int64_t nb, uint16_t *lo, uint16_t *hi) {
    uint16_t il[32], ih[32];
    for (int i = 0; i < 16; i++) { il[2 * i] = i; il[2 * i + 1] = 32 + i; ih[2 * i] = 16 + i; ih[2 * i + 1] = 48 + i; }
    const __m512i lo_i = _mm512_loadu_si512(il), hi_i = _mm512_loadu_si512(ih);
    for (int kp = 0; kp < 16; kp++) {
        const __m512i x0 = 2 * kp < nb ? _mm512_loadu_si512(v + 2 * kp * ts) : _mm512_setzero_si512();
        const __m512i x1 = 2 * kp + 1 < nb ? _mm512_loadu_si512(v + (2 * kp + 1) * ts) : _mm512_setzero_si512();
        _mm512_storeu_si512(lo + kp * 32, _mm512_permutex2var_epi16(x0, lo_i, x1));
        _mm512_storeu_si512(hi + kp * 32, _mm512_permutex2var_epi16(x0, hi_i, x1));
    }
}

/* Re-lay block b (32 keys) of KV head h: K as kp[h][b][2 halves][D/32][512], V as vp[h][b][D/16][512]. */
static void pa_pack_block(pa_job *J, int h, int64_t b) {
    const int64_t k0 = b * 32, nb = J->nk - k0 < 32 ? J->nk - k0 : 32, D = J->D;
    uint16_t *kd = J->kp + (int64_t)h * J->nkp * D + k0 * D, *vd = J->vp + (int64_t)h * J->nkp * D + k0 * D;
    const uint16_t *k = J->k + h * J->k_hs + k0 * J->k_ts, *v = J->v + h * J->v_hs + k0 * J->v_ts;
    for (int half = 0; half < 2; half++)
        for (int c = 0; c < D; c += 32)
            pa_pack_k(k + half * 16 * J->k_ts + c, J->k_ts, nb - half * 16, kd + ((int64_t)half * (D / 32) + c / 32) * 512);
    for (int c = 0; c < D; c += 32)
        pa_pack_v(v + c, J->v_ts, nb, vd + (int64_t)(c / 16) * 512, vd + (int64_t)(c / 16 + 1) * 512);
}

static void pa_pack_fn(void *a, int tid) {
    pa_job *J = a;
    const int64_t nblk = J->nkp / 32, items = nblk * J->Hkv;
    for (int64_t i = tid; i < items; i += J->p->active) pa_pack_block(J, (int)(i / nblk), i % nblk);
}

/* 2^x for x <= 0 (x >= -126 or the result is flushed to 0): 2^round(x) x a degree-5 polynomial of
 * the rest (|f| <= 0.5, relative error ~2e-7). */
FORCE_INLINE __m512 pa_exp2(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 y = _mm512_set1_ps(1.3333558146e-3f);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291076e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504108665e-2f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022650696e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718056e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(y, n);
}

#ifdef FT_AMX
/* Scores of the item's 32 rows (qa [32][D]) against the 32 keys from k0 of kp: s [32][32] (row stride PA_KB). */
FORCE_INLINE void pa_scores32(const uint16_t *qa, const uint16_t *kp, int D, int64_t k0, float *s) {
    const uint16_t *kb = kp + k0 * D;                   /* a 32-key block: 2 halves x D/32 tiles */
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int c = 0; c < D / 32; c++) {
        _tile_loadd(4, qa + 32 * c, D * 2);
        _tile_loadd(5, qa + 16 * D + 32 * c, D * 2);
        _tile_loadd(6, kb + (int64_t)c * 512, 64);
        _tile_loadd(7, kb + (int64_t)(D / 32 + c) * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, s, PA_KB * 4);
    _tile_stored(1, s + 16, PA_KB * 4);
    _tile_stored(2, s + 16 * PA_KB, PA_KB * 4);
    _tile_stored(3, s + 16 * PA_KB + 16, PA_KB * 4);
}

#endif

FORCE_INLINE int pa_block_keys(int64_t k0, int64_t pend) {     /* keys of the block at k0, rounded up to 32 */
    return pend - k0 >= PA_KB ? PA_KB : (int)((pend - k0 + 31) & ~31);
}

#ifdef FT_AMX

/* o [32][D] += pa [32][PA_KB] x V rows [k0, k0 + nkb) of vp (nkb a multiple of 32). */
static void pa_values(const uint16_t *pa, const uint16_t *vp, int D, int64_t k0, int nkb, float *o) {
    for (int j = 0; j < D / 16; j += 2) {
        _tile_loadd(0, o + 16 * j, D * 4);
        _tile_loadd(1, o + 16 * j + 16, D * 4);
        _tile_loadd(2, o + 16 * D + 16 * j, D * 4);
        _tile_loadd(3, o + 16 * D + 16 * j + 16, D * 4);
        for (int kt = 0; kt < nkb; kt += 32) {
            const uint16_t *vb = vp + (k0 + kt) * D + (int64_t)j * 512;
            _tile_loadd(4, pa + kt, PA_KB * 2);
            _tile_loadd(5, pa + 16 * PA_KB + kt, PA_KB * 2);
            _tile_loadd(6, vb, 64);
            _tile_loadd(7, vb + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, o + 16 * j, D * 4);
        _tile_stored(1, o + 16 * j + 16, D * 4);
        _tile_stored(2, o + 16 * D + 16 * j, D * 4);
        _tile_stored(3, o + 16 * D + 16 * j + 16, D * 4);
    }
}
#endif

#ifdef FT_BF16DOT
/* acc[r] += pair p of row r of `a` (rows `stride` apart), broadcast, x (x0, x1), for 8 rows: one pair
 * step of the scores' and the values' products alike. */
FORCE_INLINE void dp_rows8(__m512 acc[8][2], const uint16_t *a, int64_t stride, int p, __m512bh x0, __m512bh x1) {
    for (int r = 0; r < 8; r++) {
        int32_t pair;
        memcpy(&pair, a + r * stride + 2 * p, 4);
        const __m512bh b = (__m512bh)_mm512_set1_epi32(pair);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], b, x0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], b, x1);
    }
}

/* The tile products above as vdpbf16ps (the B layouts are the vectors it multiplies: 16 columns
 * x a bf16 pair each), a row's pair broadcast, 8 rows x 32 columns of accumulators in registers
 * over the whole reduction (Zen 4 issues a 512-bit vdpbf16ps a cycle; 16 independent
 * accumulators cover its latency, and 10 loads per 16 products stay under the 2 load ports). */
static void pv_scores32(const uint16_t *qa, const uint16_t *kp, int D, int64_t k0, float *s) {
    const uint16_t *kb = kp + k0 * D;
    for (int r0 = 0; r0 < PA_ROWS; r0 += 8) {
        __m512 acc[8][2];
        for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int c = 0; c < D / 32; c++) {
            const uint16_t *b0 = kb + (int64_t)c * 512, *b1 = kb + (int64_t)(D / 32 + c) * 512;
            const uint16_t *qc = qa + r0 * D + 32 * c;
            for (int p = 0; p < 16; p++) {
                const __m512bh x0 = (__m512bh)_mm512_loadu_si512(b0 + 32 * p), x1 = (__m512bh)_mm512_loadu_si512(b1 + 32 * p);
                dp_rows8(acc, qc, D, p, x0, x1);
            }
        }
        for (int r = 0; r < 8; r++) {
            _mm512_storeu_ps(s + (r0 + r) * PA_KB, acc[r][0]);
            _mm512_storeu_ps(s + (r0 + r) * PA_KB + 16, acc[r][1]);
        }
    }
}

static void pv_values(const uint16_t *pa, const uint16_t *vp, int D, int64_t k0, int nkb, float *o) {
    for (int r0 = 0; r0 < PA_ROWS; r0 += 8)
        for (int j = 0; j < D / 16; j += 2) {
            __m512 acc[8][2];
            for (int r = 0; r < 8; r++) {
                acc[r][0] = _mm512_loadu_ps(o + (r0 + r) * D + 16 * j);
                acc[r][1] = _mm512_loadu_ps(o + (r0 + r) * D + 16 * j + 16);
            }
            for (int kt = 0; kt < nkb; kt += 32) {
                const uint16_t *vb = vp + (k0 + kt) * D + (int64_t)j * 512, *pr = pa + r0 * PA_KB + kt;
                for (int p = 0; p < 16; p++) {
                    const __m512bh x0 = (__m512bh)_mm512_loadu_si512(vb + 32 * p);
                    const __m512bh x1 = (__m512bh)_mm512_loadu_si512(vb + 512 + 32 * p);
                    dp_rows8(acc, pr, PA_KB, p, x0, x1);
                }
            }
            for (int r = 0; r < 8; r++) {
                _mm512_storeu_ps(o + (r0 + r) * D + 16 * j, acc[r][0]);
                _mm512_storeu_ps(o + (r0 + r) * D + 16 * j + 16, acc[r][1]);
            }
        }
}
#endif

/* One mode's scores / values (the mode a compile-time constant in each specialization of pa_item). */
FORCE_INLINE void pa_scores(int amx, const uint16_t *qa, const uint16_t *kp, int D, int64_t k0, float *s) {
#ifdef FT_AMX
    if (amx) { pa_scores32(qa, kp, D, k0, s); return; }
#endif
#ifdef FT_BF16DOT
    pv_scores32(qa, kp, D, k0, s);
#endif
    (void)amx; (void)qa; (void)kp; (void)D; (void)k0; (void)s;
}

FORCE_INLINE void pa_vals(int amx, const uint16_t *pa, const uint16_t *vp, int D, int64_t k0, int nkb, float *o) {
#ifdef FT_AMX
    if (amx) { pa_values(pa, vp, D, k0, nkb, o); return; }
#endif
#ifdef FT_BF16DOT
    pv_values(pa, vp, D, k0, nkb, o);
#endif
    (void)amx; (void)pa; (void)vp; (void)D; (void)k0; (void)nkb; (void)o;
}

FORCE_INLINE __mmask16 pa_first(int n) {     /* the first n of 16 lanes (n clamped to 0..16) */
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* The online softmax of one row over its visible scores [lo, vis) of the block (s, base-2 units after
 * scale2; at least one visible): the running max m and sum l updated, the row's accumulators o
 * rescaled, the numerators rounded to bf16 into pa (zeros elsewhere up to nkb). */
static void pa_softmax_row(float *s, int lo, int vis, int nkb, float scale2, float *m, float *l, float *o, int D,
                           uint16_t *pa) {
    const __m512 sc = _mm512_set1_ps(scale2);
    __m512 x[PA_KB / 16], mx = _mm512_set1_ps(-INFINITY);
    __mmask16 k[PA_KB / 16];
    for (int i = 0; i < nkb / 16; i++) {
        k[i] = pa_first(vis - 16 * i) & (__mmask16)~pa_first(lo - 16 * i);
        x[i] = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), k[i], _mm512_loadu_ps(s + 16 * i), sc);
        mx = _mm512_max_ps(mx, x[i]);
    }
    const float bm = _mm512_reduce_max_ps(mx), mn = bm > *m ? bm : *m;
    const __m512 mv = _mm512_set1_ps(mn);
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < nkb / 16; i += 2) {
        const __m512 e0 = _mm512_maskz_mov_ps(k[i], pa_exp2(_mm512_sub_ps(x[i], mv)));
        const __m512 e1 = _mm512_maskz_mov_ps(k[i + 1], pa_exp2(_mm512_sub_ps(x[i + 1], mv)));
        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
        _mm512_storeu_si512(pa + 16 * i, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
    if (mn > *m) {              /* rescale what earlier blocks accumulated (first block: o is 0) */
        const float a = exp2f(*m - mn);
        *l *= a;
        const __m512 av = _mm512_set1_ps(a);
        for (int c = 0; c < D; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), av));
        *m = mn;
    }
    *l += _mm512_reduce_add_ps(sum);
}

/* Item it: KV head h, row block rb (rows 32 rb .. of the folded [nq x G] query rows); the items
 * of a head in a row (its re-laid K and V stay in L2), the heaviest first. */
FORCE_INLINE void pa_item(pa_job *J, int it, uint8_t *ws, const int amx) {
    const int D = J->D, G = J->G, h = it / J->rblocks, rb = J->rblocks - 1 - it % J->rblocks;
    const int64_t R = (int64_t)J->nq * G, u0 = (int64_t)rb * PA_ROWS;
    uint16_t *qa = (uint16_t *)ws, *pa = qa + PA_ROWS * D;
    float *s = (float *)(pa + PA_ROWS * PA_KB), *o = s + 2 * PA_ROWS * PA_KB, *m = o + PA_ROWS * D, *l = m + PA_ROWS;
    for (int r = 0; r < PA_ROWS; r++) {
        const int64_t u = u0 + r;
        /* a sink: the row's softmax starts from its logit (max = sink, sum = exp(0)), o = 0 */
        m[r] = J->sinks && u < R ? J->sinks[h * G + u % G] * 1.44269504088896341f : -INFINITY;
        l[r] = J->sinks && u < R ? 1.f : 0.f;
        if (u < R) memcpy(qa + r * D, J->q + (h * G + u % G) * J->q_hs + (u / G) * J->q_ts, (size_t)D * 2);
        else memset(qa + r * D, 0, (size_t)D * 2);
    }
    memset(o, 0, (size_t)PA_ROWS * D * 4);
    const int64_t last = u0 + PA_ROWS - 1 < R ? u0 + PA_ROWS - 1 : R - 1, pend = J->past + last / G + 1;
    /* the first key of the first row's window, down to a 32-key block (blocks before it: never touched) */
    const int64_t kfirst = J->past + u0 / G + 1 - J->window, kstart = kfirst > 0 ? kfirst & ~(int64_t)31 : 0;
    const uint16_t *kp = J->kp + (int64_t)h * J->nkp * D, *vp = J->vp + (int64_t)h * J->nkp * D;
    /* the scores of the next block are computed while this block's softmax runs (tiles and
     * AVX-512 are separate units: a group of tile products every few rows), into the other buffer */
    for (int kt = 0; kt < pa_block_keys(kstart, pend); kt += 32) pa_scores(amx, qa, kp, D, kstart + kt, s + kt);
    for (int64_t k0 = kstart, b = 0; k0 < pend; k0 += PA_KB, b ^= 1) {
        const int nkb = pa_block_keys(k0, pend), ng = k0 + PA_KB < pend ? pa_block_keys(k0 + PA_KB, pend) / 32 : 0;
        float *sc = s + b * PA_ROWS * PA_KB, *sn = s + (b ^ 1) * PA_ROWS * PA_KB;
        for (int r = 0, g = 0; r < PA_ROWS; r++) {
            for (; g < ng && g * PA_ROWS <= r * ng; g++) pa_scores(amx, qa, kp, D, k0 + PA_KB + 32 * g, sn + 32 * g);
            const int64_t u = u0 + r, vis = u < R ? J->past + u / G + 1 - k0 : 0, lo = vis - J->window;
            if (vis <= 0 || lo >= nkb) { memset(pa + r * PA_KB, 0, PA_KB * 2); continue; }
            pa_softmax_row(sc + r * PA_KB, lo > 0 ? (int)lo : 0, vis < nkb ? (int)vis : nkb, nkb, J->scale2, m + r,
                           l + r, o + r * D, D, pa + r * PA_KB);
        }
        pa_vals(amx, pa, vp, D, k0, nkb, o);
    }
    for (int r = 0; r < PA_ROWS && u0 + r < R; r++) {
        const int64_t u = u0 + r;
        float *dst = J->out + (h * G + u % G) * J->o_hs + (u / G) * J->o_ts;
        const __m512 inv = _mm512_set1_ps(1.f / l[r]);
        for (int c = 0; c < D; c += 16) _mm512_storeu_ps(dst + c, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + c), inv));
    }
}

#ifdef FT_AMX
static void pa_fn(void *a, int tid) {
    pa_job *J = a;
    amx_config();
    for (int it; (it = atomic_fetch_add(&J->next, 1)) < J->items;) pa_item(J, it, J->ws + tid * J->ws_stride, 1);
    _tile_release();
}
#endif

#ifdef FT_BF16DOT
static void pv_fn(void *a, int tid) {
    pa_job *J = a;
    for (int it; (it = atomic_fetch_add(&J->next, 1)) < J->items;) pa_item(J, it, J->ws + tid * J->ws_stride, 0);
}
#endif
#endif

/* Causal attention of nq queries at the last nq of nk positions: q [Hq][nq][D], k/v [Hkv][nk][D]
 * bf16 at the given head / token strides (elements), out fp32 [Hq][nq][D] likewise; sinks [Hq]
 * fp32 logits or NULL, window the keys each query sees (itself and the window - 1 before it; 0:
 * all). 0 when done; 1 when not run here (switched off, D not a multiple of 32 up to 256, Hq not
 * a multiple of Hkv): the caller runs torch's kernel; -2 when the scratch cannot be allocated. */
int ft_prefill_attention_sinks(void *vp, const uint16_t *q, int64_t q_hs, int64_t q_ts, int nq, int Hq, int Hkv,
                               int D, const uint16_t *k, int64_t k_hs, int64_t k_ts, const uint16_t *v, int64_t v_hs,
                               int64_t v_ts, int64_t nk, float scale, float *out, int64_t o_hs, int64_t o_ts,
                               const float *sinks, int64_t window) {
#ifdef PA_KERNEL
    ft_pool *p = vp;
    if (!ft_prefill_att_mode || D % 32 || D > 256 || Hkv < 1 || Hq % Hkv || nq < 1 || nk < nq) return 1;
    const int G = Hq / Hkv;
    const int64_t nkp = (nk + PA_KB - 1) / PA_KB * PA_KB, pack = (int64_t)Hkv * nkp * D * 2;
    const int64_t ws_stride = ((int64_t)PA_ROWS * (D * 2 + PA_KB * 2 + 2 * PA_KB * 4 + D * 4 + 8) + 63) & ~(int64_t)63;
    uint8_t *mem = scratch(p, (size_t)(2 * pack + ws_stride * p->n + 64));
    if (!mem) return -2;
    pa_job J = {q, q_hs, q_ts, k, k_hs, k_ts, v, v_hs, v_ts, out, o_hs, o_ts, nq, Hq, Hkv, D, G, nk, nkp, nk - nq,
                scale * 1.44269504088896341f, sinks, window > 0 && window <= nk ? window : nk + 1, (uint16_t *)mem,
                (uint16_t *)(mem + pack), mem + 2 * pack, ws_stride, 0, 0, 0, p};
    J.rblocks = (int)((nq * (int64_t)G + PA_ROWS - 1) / PA_ROWS);
    J.items = J.rblocks * Hkv;
    pool_run(p, pa_pack_fn, &J);           /* a prompt's attention is never too small for the pool */
#ifdef FT_AMX
    if (ft_prefill_att_mode == PA_AMX) { pool_run(p, pa_fn, &J); return 0; }
#endif
#ifdef FT_BF16DOT
    pool_run(p, pv_fn, &J);
#endif
    return 0;
#else
    (void)vp; (void)q; (void)q_hs; (void)q_ts; (void)nq; (void)Hq; (void)Hkv; (void)D; (void)k; (void)k_hs;
    (void)k_ts; (void)v; (void)v_hs; (void)v_ts; (void)nk; (void)scale; (void)out; (void)o_hs; (void)o_ts;
    (void)sinks; (void)window;
    return 1;
#endif
}

/* Plain causal attention: ft_prefill_attention_sinks without sinks or a window. */
int ft_prefill_attention(void *vp, const uint16_t *q, int64_t q_hs, int64_t q_ts, int nq, int Hq, int Hkv, int D,
                         const uint16_t *k, int64_t k_hs, int64_t k_ts, const uint16_t *v, int64_t v_hs, int64_t v_ts,
                         int64_t nk, float scale, float *out, int64_t o_hs, int64_t o_ts) {
    return ft_prefill_attention_sinks(vp, q, q_hs, q_ts, nq, Hq, Hkv, D, k, k_hs, k_ts, v, v_hs, v_ts, nk, scale, out,
                                      o_hs, o_ts, NULL, 0);
}
