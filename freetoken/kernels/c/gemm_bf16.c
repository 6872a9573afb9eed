/* Prefill GEMMs over bf16 weights at the matrix units' speed: y[M, N] = x[M, K] @ W[N, K]^T with
 * W read in place (row stride w_rs bytes) and x rounded to bf16 once per call, products summed
 * in fp32 (what torch's bf16 GEMM and llama.cpp's bf16 path compute).
 *
 * x is packed once per call (a 16 x 16 register transpose of bf16 pairs per 16 tokens x 32 columns)
 * into blocks of 16 tokens, [K/2 pairs][16 tokens][2] bf16 (zero
 * padded to 16 tokens and to 32 columns): exactly AMX's B-tile layout (16 pair rows x 16 columns
 * of 32 bits per 32 columns of K), and the vector layout a vdpbf16ps tile multiplies a broadcast
 * weight pair with. So the weights need no layout change (AMX's A tile is 16 weight rows, only
 * copied per sub-panel to be contiguous; the vdpbf16ps tile broadcasts one pair of a row), and the results come out transposed,
 * [rows][tokens], written back per 16x16 block.
 *
 * Kernels (FT_GEMM_*, chosen per call by the caller from the calibration in kernels/choices.py):
 *   AMX:       tdpbf16ps on 2 x 2 tiles (32 rows x 32 tokens), K in sub-panels of 256 columns: the
 *              sub-panel of 32 rows is copied into tile order (contiguous A tiles) and stays in L1
 *              while every pair of token blocks of the chunk passes (only x streams from L2; 4 A
 *              + 4 x tiles in L1 ran at 94% of the peak, both from L2 at 30%), the accumulators
 *              wait in a per-thread buffer between sub-panels, the next sub-panel is copied a slice
 *              of rows after each pair's tiles (overlapping them), the weights after it prefetched,
 *              a large output streamed past the caches; a dense call of 4+ chunks keeps the first
 *              chunk's copies in a per-call scratch and the later chunks only prefetch them,
 *              where the CPU has AMX-BF16 and the OS grants the tile state (arch_prctl
 *              ARCH_REQ_XCOMP_PERM, checked once, and a first tile op run in a forked child so a
 *              VM that faults on it refuses cleanly).
 *   VDPBF16PS: 8 rows x 32 tokens of accumulators, one broadcast weight pair per row per step.
 *   REF:       the same arithmetic in plain C (every build: the builds without the instructions
 *              run the forced choice through it, so the tests check the layout on each). */
#include "ft_kernels.h"

#ifdef FT_AMX
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#define MC 256          /* tokens per chunk: their packed x (256 x K bf16) stays in L2 */

#define AMX_MC 1024     /* most tokens per chunk of the AMX tiles */
#define AMX_XB (1 << 20) /* bytes of packed x per chunk: half the L2, the rest for weights and accumulators */
/* Blocks of 16 tokens per chunk: their packed x stays in L2 while every 32 weight rows pass over
 * it, so the weights come from memory once per chunk (256 tokens at K = 2048, 1024 at K <= 512). */
static int amx_chunk_blocks(int K) {
    const int64_t b = AMX_XB / blk_bytes(K) / 2 * 2;
    return b < 16 ? 16 : (b > AMX_MC / 16 ? AMX_MC / 16 : (int)b);
}

/* Tokens per chunk of the tiles at K (whole blocks of 16): moe.c runs a large expert group's
 * column blocks over one such chunk at a time, so its packed x stays in L2 across them. */
FT_HIDDEN int gemm_chunk_tokens(int K) { return 16 * amx_chunk_blocks(K); }

/* ------------------------------------------------------------------ AMX availability */

#ifdef FT_AMX
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
typedef struct { uint8_t palette, start; uint8_t rsv[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;

FT_HIDDEN void amx_config(void) {    /* every tile 16 rows x 64 bytes; per thread, before tile ops */
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) { c.colsb[i] = 64; c.rows[i] = 16; }
    __asm__ volatile("" : : "r"(&c) : "memory");   /* gcc drops the stores ldtilecfg reads otherwise */
    _tile_loadconfig(&c);
}

static int amx_probe(void) {      /* 1 when a tile op runs (in a child: a fault there is a refusal) */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        static uint16_t a[512], b[512];
        static float c[256];
        for (int i = 0; i < 512; i++) a[i] = b[i] = 0x3f80;    /* 1.0 */
        amx_config();
        _tile_zero(0); _tile_loadd(4, a, 64); _tile_loadd(6, b, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_stored(0, c, 64);
        _tile_release();
        _exit(c[0] == 32.f && c[255] == 32.f ? 0 : 1);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {}
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}
static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_init(void) { amx_ok = amx_probe(); }
#endif

/* 1 when this build and the OS run AMX tiles here (the permission is requested on first call). */
int ft_amx_ready(void) {
#ifdef FT_AMX
    pthread_once(&amx_once, amx_init);
    return amx_ok;
#else
    return 0;
#endif
}

/* Which kernels run in this build: bit 1 AMX (when granted), bit 2 vdpbf16ps, bit 3 the reference. */
int ft_gemm_modes(void) {
    int m = 1 << FT_GEMM_REF;
#ifdef FT_BF16DOT
    m |= 1 << FT_GEMM_VDPBF16PS;
#endif
    if (ft_amx_ready()) m |= 1 << FT_GEMM_AMX;
    return m;
}

/* ------------------------------------------------------------------ packing */

#ifdef FT_BF16DOT
/* Columns [k, k+32) of 16 tokens -> their 16 pair rows at dst (16 tokens x 2 bf16 each): each
 * token's 16 pairs are one vector, so the block is a 16 x 16 transpose of 32-bit pairs (two
 * unpack stages within 128-bit lanes, then a 4 x 4 transpose of the lanes). */
static void pack_t16(const float *const *rows, int k, uint16_t *dst) {
    __m512i r[16];
    for (int i = 0; i < 16; i++)
        r[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(rows[i] + k + 16), _mm512_loadu_ps(rows[i] + k));
    t16x16(r, dst);
}
#endif

/* Columns [c0, c1) (c0 even) of tokens [m0, m0+16) of x (rows of fp32 through `rows`, m < M
 * valid) into their packed block; c1 == K also zero-fills the padding up to kpad(K). */
FT_HIDDEN void gemm_pack(const float *const *rows, int m0, int M, int K, int c0, int c1, uint16_t *dst) {
    const int64_t p1 = c1 == K ? kpad(K) / 2 : (c1 + 1) / 2;
    int k0 = c0, whole = 0;
#ifdef FT_BF16DOT
    k0 = c0 + ((c1 - c0) & ~31);
    whole = m0 + 16 <= M;
#endif
    const int64_t z0 = (whole ? k0 : c0) / 2;     /* pair rows not written below start zeroed */
    memset(dst + z0 * 32, 0, (size_t)(p1 - z0) * 64);
#ifdef FT_BF16DOT
    if (whole) {    /* a whole block: 16 x 16 bf16 pairs transposed in registers */
        for (int k = c0; k < k0; k += 32) pack_t16(rows + m0, k, dst + (int64_t)(k >> 1) * 32);
    } else {        /* 32 columns of a token -> 16 bf16 pairs, scattered to their 16 pair rows */
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(16));
        for (int i = 0; m0 + i < M; i++) {
            const float *x = rows[m0 + i];
            for (int k = c0; k < k0; k += 32) {
                __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
                _mm512_i32scatter_epi32((int *)(dst + (int64_t)(k >> 1) * 32 + 2 * i), idx, (__m512i)v, 4);
            }
        }
    }
#endif
    for (int i = 0; i < 16 && m0 + i < M; i++) {
        const float *x = rows[m0 + i];
        for (int k = k0; k < c1; k++) dst[(int64_t)(k >> 1) * 32 + 2 * i + (k & 1)] = f32_to_bf16(x[k]);
    }
}

/* ------------------------------------------------------------------ the tiles
 * out[m][n - n0] (row stride ldo) for rows [n0, n1) of W and tokens [0, M) of the packed x. */

static void ref_rows(const uint8_t *w, int64_t w_rs, int n0, int n1, int K, const uint16_t *xp, int M,
                     float *out, int64_t ldo) {
    const int64_t bb = blk_bytes(K) / 2;
    for (int n = n0; n < n1; n++) {
        const uint16_t *wr = (const uint16_t *)(w + (int64_t)n * w_rs);
        for (int m = 0; m < M; m++) {
            const uint16_t *xb = xp + (m / 16) * bb + 2 * (m % 16);
            float s = 0.f;
            for (int k = 0; k < K; k++) s += bf16_to_f32(wr[k]) * bf16_to_f32(xb[(int64_t)(k >> 1) * 32 + (k & 1)]);
            out[(int64_t)m * ldo + n - n0] = s;
        }
    }
}

#ifdef FT_BF16DOT
/* NR rows x 2 blocks of 16 tokens, accumulators [row][block]; NR compile-time. */
FORCE_INLINE void vtile(const uint8_t *w, int64_t w_rs, int n, int K, const uint16_t *b0, const uint16_t *b1,
                        int nb, float *out, int64_t ldo, int m0, int M, int n0, const int NR) {
    __m512 acc[8][2];
    const uint32_t *wr[8];
    for (int r = 0; r < NR; r++) {
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        wr[r] = (const uint32_t *)(w + (int64_t)(n + r) * w_rs);
    }
    const int kp = K / 2;
    if (nb == 2) {
        for (int p = 0; p < kp; p++) {
            __m512bh x0 = (__m512bh)_mm512_loadu_si512(b0 + 32 * p);
            __m512bh x1 = (__m512bh)_mm512_loadu_si512(b1 + 32 * p);
            for (int r = 0; r < NR; r++) {
                __m512bh wb = (__m512bh)_mm512_set1_epi32((int)wr[r][p]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], wb, x0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], wb, x1);
            }
        }
    } else {
        for (int p = 0; p < kp; p++) {
            __m512bh x0 = (__m512bh)_mm512_loadu_si512(b0 + 32 * p);
            for (int r = 0; r < NR; r++)
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)_mm512_set1_epi32((int)wr[r][p]), x0);
        }
    }
    float t[16];
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < nb; b++) {
            _mm512_storeu_ps(t, acc[r][b]);
            for (int i = 0; i < 16 && m0 + 16 * b + i < M; i++) out[(int64_t)(m0 + 16 * b + i) * ldo + n + r - n0] = t[i];
        }
}

static void vdp_rows(const uint8_t *w, int64_t w_rs, int n0, int n1, int K, const uint16_t *xp, int M,
                     float *out, int64_t ldo) {
    const int64_t bb = blk_bytes(K) / 2;
    const int nblk = (M + 15) / 16;
    for (int c = 0; c < nblk; c += MC / 16) {               /* a chunk of tokens stays in L2 */
        const int ce = c + MC / 16 < nblk ? c + MC / 16 : nblk;
        for (int n = n0; n < n1; n += 8) {                   /* 8 weight rows stay in L1 */
            const int nr = n1 - n < 8 ? n1 - n : 8;
            for (int b = c; b < ce; b += 2) {
                const int nb = ce - b >= 2 ? 2 : 1;
                const uint16_t *b0 = xp + b * bb, *b1 = b0 + bb;
                switch (nr) {
                case 8: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 8); break;
                case 7: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 7); break;
                case 6: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 6); break;
                case 5: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 5); break;
                case 4: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 4); break;
                case 3: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 3); break;
                case 2: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 2); break;
                default: vtile(w, w_rs, n, K, b0, b1, nb, out, ldo, 16 * b, M, n0, 1); break;
                }
            }
        }
    }
}
#endif

#ifdef FT_AMX
/* C tile (16 rows x 16 tokens, fp32) stored in `t` -> out (transposed, valid rows/tokens only):
 * a 16 x 16 transpose in registers (unpacks within 128-bit lanes, then a 4 x 4 transpose of the
 * lanes), one store per token. `stream`: whole aligned lines bypass the caches (a dense GEMM's
 * output larger than L2: the cached stores, each a miss on a line 16 tokens apart, held the tiles
 * up; streamed, 1.3x the tiles at 512 tokens, 1.4x at 4096, docs/benchmarks.md). */
static inline void amx_put(const float *t, float *out, int64_t ldo, int m0, int M, int nr, int n, int n0,
                           const float *bias, int stream) {
    __m512 r[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(t + 16 * i);
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int b = 0; b < 16; b += 4) {   /* r[b + c], lane L: token 4L + c of rows b..b+3 */
        r[b] = (__m512)_mm512_unpacklo_pd((__m512d)u[b], (__m512d)u[b + 2]);
        r[b + 1] = (__m512)_mm512_unpackhi_pd((__m512d)u[b], (__m512d)u[b + 2]);
        r[b + 2] = (__m512)_mm512_unpacklo_pd((__m512d)u[b + 1], (__m512d)u[b + 3]);
        r[b + 3] = (__m512)_mm512_unpackhi_pd((__m512d)u[b + 1], (__m512d)u[b + 3]);
    }
    const __mmask16 mk = (__mmask16)((1u << nr) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mk, bias + n) : _mm512_setzero_ps();   /* rows n.. */
    float *o = out + (int64_t)m0 * ldo + n - n0;
    const int nt = M - m0 < 16 ? M - m0 : 16;
    for (int c = 0; c < 4; c++) {
        const __m512 p0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), p1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
        const __m512 p2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44), p3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
        const __m512 v[4] = {_mm512_shuffle_f32x4(p0, p2, 0x88), _mm512_shuffle_f32x4(p0, p2, 0xDD),
                             _mm512_shuffle_f32x4(p1, p3, 0x88), _mm512_shuffle_f32x4(p1, p3, 0xDD)};
        for (int q = 0; q < 4; q++) {   /* v[q]: token 4q + c */
            float *d = o + (int64_t)(4 * q + c) * ldo;
            if (4 * q + c >= nt) continue;
            const __m512 y = _mm512_add_ps(v[q], bv);
            if (stream && nr == 16 && !((uintptr_t)d & 63)) { _mm512_stream_ps(d, y); continue; }
            _mm512_mask_storeu_ps(d, mk, y);
        }
    }
}

/* Asks L2 for steps [s0, s1) of weight row `row`, past the last row too: the rows a caller walking
 * down the matrix asks for next (a prefetch of an address outside the weights is dropped, never a fault). */
static inline void amx_prefetch(const uint8_t *w, int64_t w_rs, int row, int K, int64_t s0, int64_t s1) {
    const int64_t full = K / 32, e = (s1 < full ? s1 : full) * 64;
    const char *q = (const char *)(w + (int64_t)row * w_rs);
    for (int64_t o = s0 * 64; o < e; o += 64) _mm_prefetch(q + o, _MM_HINT_T1);
}

/* Rows [r0, r1) of the sub-panel of steps [s0, s1) (32 columns each) of 32 weight rows from n (rows
 * >= n1 zero) -> dst [step - s0][32 rows][32 bf16]: two A tiles per step, contiguous
 * (rows a page apart would share one L1 set), zero-padded past K. Also asks L2 for the same rows of
 * the sub-panel after it (rows from nxt_n, steps nxt_s0..): the weights come from memory once per
 * chunk of tokens, and the fetch overlaps the tiles' work. */
static void amx_pack_a(const uint8_t *w, int64_t w_rs, int n, int n1, int K, int64_t s0, int64_t s1, int r0, int r1,
                       uint16_t *dst, int nxt_n, int64_t nxt_s0, int64_t nxt_s1) {
    const int64_t full = K / 32;
    for (int r = r0; r < r1; r++) {
        const uint16_t *src = (const uint16_t *)(w + (int64_t)(n + r) * w_rs);
        uint16_t *d = dst + r * 32 - s0 * 1024;
        amx_prefetch(w, w_rs, nxt_n + r, K, nxt_s0, nxt_s1);
        if (n + r >= n1) {
            for (int64_t k = s0; k < s1; k++) _mm512_storeu_si512(d + k * 1024, _mm512_setzero_si512());
            continue;
        }
        const int64_t fe = s1 < full ? s1 : full;
        for (int64_t k = s0; k < fe; k++) _mm512_storeu_si512(d + k * 1024, _mm512_loadu_si512(src + 32 * k));
        if (fe < s1) {    /* the last K % 32 columns, zero-padded */
            const __mmask32 m = (__mmask32)((1ull << (K - 32 * full)) - 1);
            _mm512_storeu_si512(d + full * 1024, _mm512_maskz_loadu_epi16(m, src + 32 * full));
        }
    }
}

#define AKS 8           /* K steps (32 columns) per A sub-panel: 32 rows x 256 bf16 = 16 KB stays in L1
                         * (16 steps measured no faster: half the accumulator traffic, twice the L1 load) */
_Static_assert(AKS < GEMM_PAD_STEP, "a sub-panel fits its half of the scratch");

/* 2 x 2 tiles (32 rows x 32 tokens) over steps [0, ns) of a sub-panel: C from `cb` (or zero on the
 * first sub-panel), back to `cb` (4 tiles of 16 x 16 fp32). */
FORCE_INLINE void amx_block(const uint16_t *a, const uint16_t *b0, const uint16_t *b1, int64_t ns, float *cb,
                            int first, int na, int nb) {
    if (first) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    else { _tile_loadd(0, cb, 64); _tile_loadd(1, cb + 256, 64); _tile_loadd(2, cb + 512, 64); _tile_loadd(3, cb + 768, 64); }
    if (na == 2 && nb == 2) {
        for (int64_t k = 0; k < ns; k++) {
            _tile_loadd(4, a + 1024 * k, 64);
            _tile_loadd(6, b0 + 512 * k, 64);
            _tile_loadd(5, a + 1024 * k + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, b1 + 512 * k, 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    } else if (na == 2) {
        for (int64_t k = 0; k < ns; k++) {
            _tile_loadd(4, a + 1024 * k, 64);
            _tile_loadd(5, a + 1024 * k + 512, 64);
            _tile_loadd(6, b0 + 512 * k, 64);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(2, 5, 6);
        }
    } else if (nb == 2) {
        for (int64_t k = 0; k < ns; k++) {
            _tile_loadd(4, a + 1024 * k, 64);
            _tile_loadd(6, b0 + 512 * k, 64);
            _tile_loadd(7, b1 + 512 * k, 64);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        }
    } else {
        for (int64_t k = 0; k < ns; k++) {
            _tile_loadd(4, a + 1024 * k, 64);
            _tile_loadd(6, b0 + 512 * k, 64);
            _tile_dpbf16ps(0, 4, 6);
        }
    }
    _tile_stored(0, cb, 64); _tile_stored(1, cb + 256, 64); _tile_stored(2, cb + 512, 64); _tile_stored(3, cb + 768, 64);
}

/* What the tile loop itself reaches with its operands at each cache level, on the calling thread
 * (the ceiling of amx_rows' structure on this machine; bench/gemm_tiles.py prints it beside the
 * peak): a chunk of 256 tokens x 2048 columns walked as amx_rows walks it, sub-panels of AKS steps,
 * every pair of token blocks through amx_block with its accumulators in a per-pair buffer between
 * sub-panels, A the 32-row sub-panel in L1 (never copied here). place 0: the same pair of x blocks
 * every time (x in L1: the tile unit's own rate with this loop), 1: the chunk's 1 MB of packed x
 * (x from L2, as in the GEMM), 2: a different 1 MB chunk of a 64 MB buffer each pass (x from L3 or
 * memory). A and x hold bf16 1.0, so every accumulator ends at 2048 (*check: 2048, else the first
 * accumulator that is not). Returns
 * the multiply-adds done, -1 where the tiles do not run. */
#define PROBE_BLKS 16                 /* blocks of 16 tokens per chunk */
#define PROBE_K 2048
#define PROBE_CHUNKS 64
static uint16_t *probe_x;
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static void probe_init(void) {
    const size_t n = (size_t)PROBE_CHUNKS * PROBE_BLKS * 16 * PROBE_K;
    probe_x = aligned_alloc(64, n * 2);
    if (probe_x)
        for (size_t i = 0; i < n; i++) probe_x[i] = 0x3f80;
}

#endif

int64_t ft_amx_tile_probe(int place, int64_t passes, float *check) {
#ifdef FT_AMX
    if (!ft_amx_ready() || place < 0 || place > 2) return -1;
    pthread_once(&probe_once, probe_init);
    if (!probe_x) return -1;
    static __thread uint16_t a[AKS * 1024] __attribute__((aligned(64)));
    static __thread float cb[PROBE_BLKS / 2][1024] __attribute__((aligned(64)));
    for (int i = 0; i < AKS * 1024; i++) a[i] = 0x3f80;
    const int64_t bb = blk_bytes(PROBE_K) / 2, kk = PROBE_K / 32, chunk = PROBE_BLKS * bb;
    amx_config();
    for (int64_t it = 0; it < passes; it++) {
        const uint16_t *x = probe_x + (place == 2 ? (it % PROBE_CHUNKS) * chunk : 0);
        for (int64_t s0 = 0; s0 < kk; s0 += AKS)
            for (int j = 0; j < PROBE_BLKS / 2; j++) {
                const uint16_t *b0 = place == 0 ? x : x + 2 * j * bb + 512 * s0;
                amx_block(a, b0, b0 + (place == 0 ? 512 * AKS : bb), AKS, cb[j], s0 == 0, 2, 2);
            }
    }
    _tile_release();
    float got = 2048.f;     /* every accumulator of every pair, else the first that is not 2048 */
    for (int j = 0; j < PROBE_BLKS / 2 && got == 2048.f; j++)
        for (int i = 0; i < 1024 && got == 2048.f; i++) got = cb[j][i];
    if (check) *check = got;
    return passes * 32 * 16 * PROBE_BLKS * (int64_t)PROBE_K;
#else
    (void)place; (void)passes; (void)check;
    return -1;
#endif
}

#ifdef FT_AMX
#define AMX_AHEAD_PAIRS 4   /* pairs of token blocks from which the next sub-panel is copied during the
                             * tiles (64 tokens: 0.9x copied in between into the same half, still in L1) */

/* Asks L1 for steps [k0, k1) of a sub-panel copied in tile order (2 KB a step), L2 for those of `a2`. */
static inline void amx_prefetch_wt(const uint16_t *a, const uint16_t *a2, int k0, int k1) {
    const char *q = (const char *)(a + (int64_t)k0 * 1024), *q2 = (const char *)(a2 + (int64_t)k0 * 1024);
    for (int64_t o = 0; o < (int64_t)(k1 - k0) * 2048; o += 64) {
        _mm_prefetch(q + o, _MM_HINT_T0);
        _mm_prefetch(q2 + o, _MM_HINT_T1);
    }
}

/* One sub-panel of the walk: 32 rows from n, steps [s0, s0 + AKS); n < 0: none. */
typedef struct { int n; int64_t s0; } amx_sp;

/* The sub-panel after `p` in amx_rows' walk: K, then rows, then the first of the next chunk. */
static amx_sp amx_next(amx_sp p, int n0, int n1, int64_t kk, int more_chunks) {
    if (p.s0 + AKS < kk) return (amx_sp){p.n, p.s0 + AKS};
    if (p.n + 32 < n1) return (amx_sp){p.n + 32, 0};
    return (amx_sp){more_chunks ? n0 : -1, 0};
}

/* Rows [n0, n1) over the packed x; pad: gemm_pad_elems() bf16 scratch (two sub-panels); wt: NULL, or
 * scratch for rows [n0, n1) in tile order ((n1 - n0 + 31) / 32 x kpad(K) x 32 bf16): the first chunk
 * of tokens copies each sub-panel there (overlapped as below), the later chunks read and prefetch them.
 * Per chunk of tokens (amx_chunk_blocks) and 32 rows, K in sub-panels of AKS steps: the sub-panel's
 * A tiles come from L1 for every pair of token blocks, only the x tiles stream from L2, and the
 * 2 x 2 accumulators of each pair wait in `cb` (L1/L2) between sub-panels. The next sub-panel is
 * copied into the other half of pad a slice of rows after each pair's tiles (the copy's loads
 * and stores overlap the queued tile products, and the tiles never wait on it), or, for a
 * chunk of few pairs, in between into the same half. */
static void amx_rows(const uint8_t *w, int64_t w_rs, int n0, int n1, int K, const uint16_t *xp, int M,
                     float *out, int64_t ldo, uint16_t *pad, const float *bias, int stream, uint16_t *wt) {
    const int64_t bb = blk_bytes(K) / 2, kk = kpad(K) / 32;
    const int nblk = (M + 15) / 16, cblk = amx_chunk_blocks(K);
    static __thread float cb[AMX_MC / 32][1024] __attribute__((aligned(64)));
    amx_config();
    amx_sp cur = {n0, 0};
    int half = 0;                                   /* the half of pad holding `cur` */
    for (int c = 0; c < nblk; c += cblk) {
        const int ce = c + cblk < nblk ? c + cblk : nblk, np = (ce - c + 1) / 2;
        for (int n = n0; n < n1; n += 32) {
            const int left = n1 - n;
            const int na = left > 16 ? 2 : 1;           /* A tiles: 16 rows each */
            const int nr0 = left >= 16 ? 16 : left, nr1 = left >= 32 ? 16 : left - 16;
            for (int64_t s0 = 0; s0 < kk; s0 += AKS) {
                const int64_t s1 = s0 + AKS < kk ? s0 + AKS : kk;
                const int last = s1 == kk;
                const amx_sp nx = amx_next(cur, n0, n1, kk, ce < nblk), nn = amx_next(nx, n0, n1, kk, 1);
                const int64_t nx1 = nx.s0 + AKS < kk ? nx.s0 + AKS : kk;
                uint16_t *a = pad + half * GEMM_PAD_STEP * 1024, *an = pad + (1 - half) * GEMM_PAD_STEP * 1024, *ann = an;
                if (wt) {   /* each sub-panel at its own place; copied in the first chunk only */
                    a = wt + ((int64_t)(n - n0) / 32 * kk + s0) * 1024;
                    an = nx.n < 0 ? a : wt + ((int64_t)(nx.n - n0) / 32 * kk + nx.s0) * 1024;
                    ann = nn.n < 0 ? an : wt + ((int64_t)(nn.n - n0) / 32 * kk + nn.s0) * 1024;
                }
                const int copy = !wt || (c == 0 && !(nx.n == n0 && nx.s0 == 0));
                const int pf_n = nn.n < 0 ? nx.n : nn.n, ahead = nx.n >= 0 && np >= AMX_AHEAD_PAIRS && copy;
                if (c == 0 && n == n0 && s0 == 0) amx_pack_a(w, w_rs, n, n1, K, s0, s1, 0, 32, a, nx.n, nx.s0, nx1);
                if (nx.n < 0)       /* the walk's end: the rows after it (the caller's next call) */
                    for (int r = 0; r < 32; r++) amx_prefetch(w, w_rs, n + 32 + r, K, 0, AKS);
                for (int b = c; b < ce; b += 2) {
                    const int nb = ce - b >= 2 ? 2 : 1, j = (b - c) / 2;
                    const uint16_t *b0 = xp + b * bb + 512 * s0, *b1 = b0 + bb;
                    float *t = cb[j];
                    if (na == 2 && nb == 2) amx_block(a, b0, b1, s1 - s0, t, s0 == 0, 2, 2);
                    else amx_block(a, b0, b1, s1 - s0, t, s0 == 0, na, nb);
                    if (!copy && nx.n >= 0)   /* this pair's slice of the next sub-panel, already copied */
                        amx_prefetch_wt(an, ann, AKS * j / np, AKS * (j + 1) / np);
                    else if (ahead)     /* this pair's slice of the next sub-panel's rows */
                        amx_pack_a(w, w_rs, nx.n, n1, K, nx.s0, nx1, 32 * j / np, 32 * (j + 1) / np, an,
                                   pf_n, nn.s0, nn.s0 + AKS);
                    if (!last) continue;
                    amx_put(t, out, ldo, 16 * b, M, nr0, n, n0, bias, stream);
                    if (nb == 2) amx_put(t + 256, out, ldo, 16 * b + 16, M, nr0, n, n0, bias, stream);
                    if (na == 2) {
                        amx_put(t + 512, out, ldo, 16 * b, M, nr1, n + 16, n0, bias, stream);
                        if (nb == 2) amx_put(t + 768, out, ldo, 16 * b + 16, M, nr1, n + 16, n0, bias, stream);
                    }
                }
                if (nx.n >= 0 && !ahead && copy)
                    amx_pack_a(w, w_rs, nx.n, n1, K, nx.s0, nx1, 0, 32, wt ? an : a, pf_n, nn.s0, nn.s0 + AKS);
                cur = nx;
                half ^= ahead && !wt;
            }
        }
    }
    if (stream) _mm_sfence();       /* the streamed lines reach memory before the caller's barrier */
    _tile_release();
}
#endif

/* Whether `mode` runs here for a K (the vector tiles read whole bf16 pairs of a row in place). */
FT_HIDDEN int gemm_mode_runs(int mode, int K) {
    if (mode == FT_GEMM_AMX) return ft_amx_ready();     /* any K: rows copied, zero-padded */
    if (K % 2) return 0;
#ifdef FT_BF16DOT
    if (mode == FT_GEMM_VDPBF16PS) return 1;
#else
    if (mode == FT_GEMM_VDPBF16PS) return 0;
#endif
    return mode == FT_GEMM_REF;
}

/* out (ldo) = rows [n0, n1) of W over the packed x + bias[n] (NULL: none); pad: AMX's scratch
 * (gemm_pad_elems() bf16); stream: AMX writes whole lines past the caches. */
void gemm_rows(int mode, const uint8_t *w, int64_t w_rs, int n0, int n1, int K, const uint16_t *xp,
               int M, float *out, int64_t ldo, uint16_t *pad, const float *bias, int stream) {
    if (n0 >= n1) return;
#ifdef FT_AMX
    if (mode == FT_GEMM_AMX) { amx_rows(w, w_rs, n0, n1, K, xp, M, out, ldo, pad, bias, stream, NULL); return; }
#endif
    (void)pad; (void)stream;
#ifdef FT_BF16DOT
    if (mode == FT_GEMM_VDPBF16PS) vdp_rows(w, w_rs, n0, n1, K, xp, M, out, ldo);
    else
#endif
    ref_rows(w, w_rs, n0, n1, K, xp, M, out, ldo);
    if (bias)
        for (int m = 0; m < M; m++)
            for (int n = n0; n < n1; n++) out[(int64_t)m * ldo + n - n0] += bias[n];
}

/* ------------------------------------------------------------------ the dense GEMM */

/* Output bytes from which a dense GEMM's AMX tiles stream their results past the caches (an L2
 * of output: below it the next layer reads them from cache); ft_gemm_stream sets it (tests force both). */
static int64_t gemm_stream_bytes = 2 << 20;
int64_t ft_gemm_stream(int64_t min_bytes) {
    const int64_t was = gemm_stream_bytes;
    if (min_bytes >= 0) gemm_stream_bytes = min_bytes;
    return was;
}

/* Chunks of tokens from which a dense AMX GEMM keeps the weight sub-panels its first chunk copies
 * into tile order (a per-call scratch of the weight's size, up to GEMM_WT_MAX bytes) for the later
 * chunks to read, instead of copying them again per chunk (0: never). The per-chunk copy was a
 * quarter of the time at 4096 tokens; kept: 1.08-1.17x at 4096 tokens, 1.0x at 1024, 0.87x at 512
 * (2 chunks: the first chunk's stores into the scratch miss, one chunk reads it), so from 4 chunks
 * (docs/benchmarks.md). ft_gemm_copy_once sets it (tests force both). */
static int gemm_copy_once = 4;
#define GEMM_WT_MAX ((int64_t)64 << 20)
int ft_gemm_copy_once(int min_chunks) {
    const int was = gemm_copy_once;
    if (min_chunks >= 0) gemm_copy_once = min_chunks;
    return was;
}

/* bf16 elements of the tile-order scratch of a dense AMX call (0: none): 32 rows x kpad(K) per 32
 * rows of N (each thread's share starts at a multiple of 32 rows: its part starts at n0 / 32). */
static int64_t gemm_wt_elems(int mode, int N, int K, int M) {
#ifdef FT_AMX
    const int need = gemm_copy_once < 2 ? 2 : gemm_copy_once;    /* one chunk: nothing to reuse */
    if (mode != FT_GEMM_AMX || !gemm_copy_once || (M + 15) / 16 <= (need - 1) * amx_chunk_blocks(K)) return 0;
    const int64_t e = (int64_t)(N + 31) / 32 * kpad(K) * 32;
    return e * 2 <= GEMM_WT_MAX ? e : 0;
#else
    (void)mode; (void)N; (void)K; (void)M;
    return 0;
#endif
}

typedef struct {
    int mode; const uint8_t *w; int64_t w_rs; int N, K;
    const float *x; int64_t ldx; int M;
    const float *bias; float *y; int64_t ldy;
    uint16_t *xp; uint16_t *pad; const float **rows; uint16_t *wt;
    ft_pool *p;
} gemm_job;

static void gemm_fn(void *a, int tid) {
    gemm_job *G = a;
    const int nth = G->p->active, nblk = (G->M + 15) / 16;
    const int64_t bb = blk_bytes(G->K) / 2;
    for (int b = tid; b < nblk; b += nth) gemm_pack(G->rows, 16 * b, G->M, G->K, 0, G->K, G->xp + b * bb);
    pool_barrier(G->p);
    int n0, n1;
    split(G->N, 32, nth, tid, &n0, &n1);
    const int stream = (int64_t)G->M * G->N * 4 >= gemm_stream_bytes;
    uint16_t *pad = G->pad + (int64_t)tid * gemm_pad_elems();
#ifdef FT_AMX
    if (G->wt && n0 < n1) {     /* this thread's rows in tile order */
        uint16_t *wt = G->wt + (int64_t)n0 / 32 * kpad(G->K) * 32;
        amx_rows(G->w, G->w_rs, n0, n1, G->K, G->xp, G->M, G->y + n0, G->ldy, pad, G->bias, stream, wt);
        return;
    }
#endif
    gemm_rows(G->mode, G->w, G->w_rs, n0, n1, G->K, G->xp, G->M, G->y + n0, G->ldy, pad, G->bias, stream);
}

/* y [M, ldy] (columns 0..N-1) = x [M, ldx] fp32 @ W[N, K]^T (bf16, rows w_rs bytes apart) + bias,
 * with x rounded to bf16. Returns 0; -3 when `mode` does not run here for this K (the caller
 * falls back), -2 when the scratch cannot be allocated. */
int ft_gemm_bf16(void *vp, int mode, const void *w, int64_t w_rs, int N, int K, const float *x, int64_t ldx,
                 int64_t M, const float *bias, float *y, int64_t ldy) {
    ft_pool *p = vp;
    if (!gemm_mode_runs(mode, K)) return -3;
    if (M <= 0 || N <= 0) return 0;
    const int nblk = (int)((M + 15) / 16);
    size_t sz_xp = (size_t)nblk * (size_t)blk_bytes(K), sz_pad = (size_t)p->n * (size_t)gemm_pad_elems() * 2;
    size_t sz_rows = (size_t)M * sizeof(float *), sz_wt = (size_t)gemm_wt_elems(mode, N, K, (int)M) * 2;
    uint8_t *buf = scratch(p, sz_xp + sz_pad + sz_wt + sz_rows + 128);
    if (!buf) return -2;
    const float **rows = (const float **)(buf + (sz_xp + sz_pad + sz_wt + 63) / 64 * 64);
    for (int64_t m = 0; m < M; m++) rows[m] = x + m * ldx;
    gemm_job G = {mode, w, w_rs, N, K, x, ldx, (int)M, bias, y, ldy, (uint16_t *)buf, (uint16_t *)(buf + sz_xp),
                  rows, sz_wt ? (uint16_t *)(buf + sz_xp + sz_pad) : NULL, p};
    pool_run(p, gemm_fn, &G);
    return 0;
}

/* The prefill GEMM switches, set once per model build by the CPU choices (kernels/choices.py):
 * ft_moe_run (moe.c) runs calls of at least ft_gemm_min tokens over bf16 experts through
 * `ft_gemm_mode`'s tiles, the dense layers' prefill (layers/linear.py, ft_get_gemm(1)) through
 * `ft_gemm_dense`'s (0: never). Returns the experts' mode in effect (0 where `mode` does not run here). */
int ft_gemm_mode, ft_gemm_min = 16;
int ft_gemm_dense;
int ft_get_gemm(int dense) { return dense ? ft_gemm_dense : ft_gemm_mode; }
int ft_set_gemm(int mode, int min_tokens, int dense_mode) {
    ft_gemm_mode = mode && gemm_mode_runs(mode, 32) ? mode : 0;
    ft_gemm_min = min_tokens > 1 ? min_tokens : 1;
    ft_gemm_dense = dense_mode && gemm_mode_runs(dense_mode, 32) ? dense_mode : 0;
    return ft_gemm_mode;
}
