/* bf16 weights x bf16 activations: the dot tiles with AVX512-BF16's vdpbf16ps, as llama.cpp
 * runs bf16 weights (activations rounded to bf16 once per call, products summed in fp32).
 *
 * A run-time switch (ft_set_bf16_dot) because it rounds the activations: off by default, turned
 * on by the automatic choice where vdpbf16ps exists and measures faster (kernels/choices.py).
 * Builds without vdpbf16ps run the same arithmetic emulated (activations rounded to bf16, then
 * the fp32 tiles of dots.c), so the tests check the rounding on every variant. */
#include "ft_kernels.h"

int ft_bf16_dot_on;

/* 0 off, 1 on with emulated arithmetic, 2 on with vdpbf16ps: the mode now in effect. */
int ft_set_bf16_dot(int on) {
    ft_bf16_dot_on = on != 0;
#ifdef FT_BF16DOT
    return on ? 2 : 0;
#else
    return on ? 1 : 0;
#endif
}

/* Elements [j0, j1) of src rounded to bf16: natural order bf16 for vdpbf16ps, else as fp32 in
 * the layout of dots.c's bf16 tiles. */
void prep_bf16_pairs(const float *src, uint8_t *dst, int n, int j0, int j1) {
#ifdef FT_BF16DOT
    (void)n;
    uint16_t *o = (uint16_t *)dst;
    int j = j0;
    for (; j + 16 <= j1; j += 16) {
        __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + j));
        _mm256_storeu_si256((__m256i *)(o + j), (__m256i)h);
    }
    for (; j < j1; j++) o[j] = f32_to_bf16(src[j]);
#else
    float *o = (float *)dst;
    const int n16 = n & ~15;
    for (int j = j0; j < j1; j++) o[perm_bf16(j, n16)] = bf16_to_f32(f32_to_bf16(src[j]));
#endif
}

#ifdef FT_BF16DOT
/* res[r][t] = <row r, x_t>: 32 bf16 pairs per vdpbf16ps, R*NT (<= 16) accumulators, a masked
 * load for the last n % 32 columns. */
FORCE_INLINE void btile(const uint8_t *const *wr, int n, const uint8_t *const *xp, float (*res)[NTMAX],
                        const int R, const int NT) {
    /* one chain per (row, token) in every tile shape, so a row's dot has the same bits however
     * many tokens share the tile (a verify step's k + 1 rows == k + 1 decode steps); a GEMV's
     * 4 rows still keep 4 chains in flight */
    __m512 acc[4][NTMAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh x[NTMAX];
        for (int t = 0; t < NT; t++) x[t] = (__m512bh)_mm512_loadu_si512(xp[t] + 2 * i);
        for (int r = 0; r < R; r++) {
            PREFETCH(wr[r] + 2 * i);
            __m512bh w = (__m512bh)_mm512_loadu_si512(wr[r] + 2 * i);
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w, x[t]);
        }
    }
    if (i < n) {
        const __mmask32 m = (__mmask32)((1ull << (n - i)) - 1);
        __m512bh x[NTMAX];
        for (int t = 0; t < NT; t++) x[t] = (__m512bh)_mm512_maskz_loadu_epi16(m, xp[t] + 2 * i);
        for (int r = 0; r < R; r++) {
            __m512bh w = (__m512bh)_mm512_maskz_loadu_epi16(m, wr[r] + 2 * i);
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w, x[t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) res[r][t] = _mm512_reduce_add_ps(acc[r][t]);
}

#define BTILE_R(NT)                                                              \
    switch (R) {                                                                 \
    case 4: btile(wr, n, xp, res, 4, NT); break;                                 \
    case 3: btile(wr, n, xp, res, 3, NT); break;                                 \
    case 2: btile(wr, n, xp, res, 2, NT); break;                                 \
    default: btile(wr, n, xp, res, 1, NT); break;                                \
    }

/* dot_tile for bf16 weights with activations from prep_bf16_pairs (R <= 4, nt <= NTMAX). */
void dot_tile_bf16_pairs(const uint8_t *const *wr, int R, int n, const uint8_t *const *xp, int nt,
                         float (*res)[NTMAX]) {
    switch (nt) {
    case 1: BTILE_R(1); break;
    case 2: BTILE_R(2); break;
    case 3: BTILE_R(3); break;
    default: BTILE_R(4); break;
    }
}

/* The decode GEMV's rows (dense.c) with vdpbf16ps: R rows x NT tokens, a verify's rows in passes of
 * up to BW_TOK over a tile of BW_ROWS(NT) rows (9 rows: one pass over 3 rows, where btile's
 * NTMAX = 4 took 4 + 4 + 1 in 2-row tiles over a 32-row block; passes of 16 tokens measured
 * slower: their activations outgrow L1); btile's chains (one per (row, token), 32 pairs a step, the masked
 * tail, one reduction), so every dot has btile's bits whatever R and NT. */
FORCE_INLINE void bwide(const uint8_t *const *wr, int n, const uint8_t *x, int64_t xs, float *res, int ldr,
                        int pf_lines, const int R, const int NT) {
    __m512 acc[BW_ACC];   /* [r * NT + t]: flat and no larger than used, so it stays in registers */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r * NT + t] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh w[4];
        for (int r = 0; r < R; r++) {
            /* pf_lines of the next tile's lines a step, from this column on (a farther
             * distance alone gained nothing; see dense.c for the counts) */
            PREFETCH(wr[r] + 2 * i);
            if (pf_lines >= 2) PREFETCH(wr[r] + 2 * i + 64);
            if (pf_lines >= 3) PREFETCH(wr[r] + 2 * i + 128);
            if (pf_lines >= 4) PREFETCH(wr[r] + 2 * i + 192);
            w[r] = (__m512bh)_mm512_loadu_si512(wr[r] + 2 * i);
        }
        for (int t = 0; t < NT; t++) {
            const __m512bh xt = (__m512bh)_mm512_loadu_si512(x + t * xs + 2 * i);
            for (int r = 0; r < R; r++) acc[r * NT + t] = _mm512_dpbf16_ps(acc[r * NT + t], w[r], xt);
        }
    }
    if (i < n) {
        const __mmask32 m = (__mmask32)((1ull << (n - i)) - 1);
        __m512bh w[4];
        for (int r = 0; r < R; r++) w[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, wr[r] + 2 * i);
        for (int t = 0; t < NT; t++) {
            const __m512bh xt = (__m512bh)_mm512_maskz_loadu_epi16(m, x + t * xs + 2 * i);
            for (int r = 0; r < R; r++) acc[r * NT + t] = _mm512_dpbf16_ps(acc[r * NT + t], w[r], xt);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) res[r * ldr + t] = _mm512_reduce_add_ps(acc[r * NT + t]);
}

/* One function per shape (R rows, NT tokens), the tokens at one stride from one pointer: inlined
 * into one switch with a pointer per token, GCC kept the 3 x 9 loop's pointers and a weight vector
 * on the stack */
#define BWIDE_FN(R, NT)                                                                             \
    static __attribute__((noinline)) void bwide_##R##_##NT(const uint8_t *const *wr, int n, const uint8_t *x, \
                                                          int64_t xs, float *res, int ldr, int pf_lines) { \
        bwide(wr, n, x, xs, res, ldr, pf_lines, R, NT);                                            \
    }
BWIDE_FN(1, 1) BWIDE_FN(1, 2) BWIDE_FN(1, 3) BWIDE_FN(1, 4) BWIDE_FN(1, 5) BWIDE_FN(1, 6) BWIDE_FN(1, 7) BWIDE_FN(1, 8) BWIDE_FN(1, 9)
BWIDE_FN(3, 1) BWIDE_FN(3, 2) BWIDE_FN(3, 3) BWIDE_FN(3, 4) BWIDE_FN(3, 5) BWIDE_FN(3, 6) BWIDE_FN(3, 7) BWIDE_FN(3, 8) BWIDE_FN(3, 9)
BWIDE_FN(4, 1) BWIDE_FN(4, 2) BWIDE_FN(4, 3) BWIDE_FN(4, 4) BWIDE_FN(4, 5) BWIDE_FN(4, 6)

/* R is BW_ROWS(NT), or 3 where a call's passes took 3-row tiles and its last pass has fewer tokens
 * (13 = 7 + 6), but for a thread's last rows, which go one at a time */
#define BWIDE(NT, FOUR)                                                                             \
    case NT:                                                                                       \
        if (R == 4) FOUR;                                                                          \
        else if (R == 3) bwide_3_##NT(wr, n, x, xs, res, ldr, pf_lines);                           \
        else for (int r = 0; r < R; r++) bwide_1_##NT(wr + r, n, x, xs, res + r * ldr, ldr, pf_lines); \
        break;

/* res[r * ldr + t] = <row wr[r], x_t> for r < R (<= BW_ROWS(nt)), t < nt (<= BW_TOK), token t's
 * prepared activations at x + t * xs; pf_lines (1-4) lines of the next tile prefetched a step per row. */
void dot_rows_bf16_pairs(const uint8_t *const *wr, int R, int n, const uint8_t *x, int64_t xs, int nt, float *res,
                         int ldr, int pf_lines) {
    switch (nt) {
    BWIDE(1, bwide_4_1(wr, n, x, xs, res, ldr, pf_lines)) BWIDE(2, bwide_4_2(wr, n, x, xs, res, ldr, pf_lines))
    BWIDE(3, bwide_4_3(wr, n, x, xs, res, ldr, pf_lines)) BWIDE(4, bwide_4_4(wr, n, x, xs, res, ldr, pf_lines))
    BWIDE(5, bwide_4_5(wr, n, x, xs, res, ldr, pf_lines)) BWIDE(6, bwide_4_6(wr, n, x, xs, res, ldr, pf_lines))
    BWIDE(7, (void)0) BWIDE(8, (void)0) BWIDE(9, (void)0)
    }
}

/* Tokens a pass for a call of M tokens: one pass up to BW_TOK, two equal passes up to 16 (13-16
 * as 7-8 over 3-row tiles), beyond that equal passes of at most 6 over 4-row tiles (17 -> 6, 6, 5;
 * 65 -> 11 passes): there passes of 8-9 over 3-row tiles measured 3-7% slower (17, 24, 33, 65
 * rows, the dense bench model's linears in one process, one thread). */
int bf16_pairs_tokens(int64_t M) {
    const int most = M <= 16 ? BW_TOK : 6;
    const int64_t passes = (M + most - 1) / most;
    return (int)((M + passes - 1) / passes);
}
#endif
