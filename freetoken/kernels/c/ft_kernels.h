/* ft_kernels.h: what the C kernel files share (types, scalar decoders, the pool, the dot tiles).
 *
 * The C kernels of the pure-CPU engine. Mainly CPU expert execution: out[t] += sum_k w[t,k] *
 * down(act(gate(x[t])) * up(x[t])) for routed experts, streaming the weights straight from the
 * host pool banks and dequantizing inside the dot products (fp32 accumulation). Further down,
 * on the same dot tiles and thread pool: the dense GEMV (ft_linear_run), row dequantization for
 * prefill GEMMs (ft_dequant_rows), decode attention over the paged KV cache
 * (ft_decode_attention), and per-op helpers run on the calling thread (ft_rms_norm, ft_rope, ft_kv_write).
 *
 * One file per concept (dots.c, ggml.c, ggml_dense.c, pool.c, moe.c, dense.c, dequant.c, attention.c
 * and its block loops attention_blocks.c, bf16dot.c, norm_rope.c),
 * all compiled together in one step by freetoken/kernels/__init__.py with the system C compiler
 * and -march=native, so the preprocessor picks the widest SIMD path the machine has:
 *   FT_AVX512:   AVX-512 F/BW/VL (Skylake-X, Ice Lake, Sapphire Rapids, Zen 4) beside FT_AVX2
 *   FT_AVX2:     AVX2 + FMA + F16C (x86-64 since Haswell / Zen 1)
 *   otherwise:   portable C (any architecture; the compiler vectorises what it can)
 *
 * Work split: a persistent pool of pinned threads. Phase 1 gives every thread a disjoint,
 * 32-aligned range of the intermediate index j and runs it for all routed experts (gate row j
 * and up row I+j), phase 2 a disjoint range of output rows of `down`. So each core streams its
 * own weight rows, and no two threads write the same output element.
 *
 * Activations are prepared once per call in the layout each format's kernel wants:
 *   f32/f16/fp8: fp32;  bf16: fp32, even/odd de-interleaved per 16;
 *   int8/mxfp4:  int8 per 32-block + fp32 block scale (like llama.cpp's Q8_0 activations);
 *                for mxfp4 the int8 values are de-interleaved to match the low/high nibbles
 *                of two blocks loaded at once (perm_mxfp4).
 *   ggml:        int8 per 32-block + fp32 block scale + fp32 sums per 16 (ggml.c)
 *   nvfp4:       as mxfp4 (its 16-element groups are halves of the same 32-byte loads), plus
 *                one offset correction per 16-element group instead of per 32.
 */
#ifndef FT_KERNELS_H
#define FT_KERNELS_H
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(FT_PORTABLE)
#define FT_AVX2 1
#include <immintrin.h>
#endif
/* AVX-512 F/BW/VL: wider paths beside the AVX2 ones (which stay in use for what has no
 * AVX-512 version); FT_NO_AVX512 builds the AVX2 library on the same machine for the tests. */
#if defined(FT_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) \
    && !defined(FT_NO_AVX512)
#define FT_AVX512 1
#endif
/* AVX512-BF16's vdpbf16ps for bf16 weights (bf16dot.c), used when switched on at run time. */
#if defined(FT_AVX512) && defined(__AVX512BF16__)
#define FT_BF16DOT 1
#endif

/* AMX-BF16 tiles (gemm_bf16.c's prefill GEMM, amx_gemv.c's decode GEMV), used where the OS grants
 * the tile state (ft_amx_ready). */
#if defined(FT_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define FT_AMX 1
#endif
enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_F16 = 2, FMT_FP8 = 3, FMT_MXFP4 = 4, FMT_INT8 = 5, FMT_NVFP4 = 6, FMT_GGML = 7 };
enum { ACT_SILU = 0, ACT_SWIGLU_OAI = 1, ACT_SILU_CLAMP = 2 };
enum { XT_F32 = 0, XT_BF16 = 1 };
#define NTMAX 4
#define RB 32   /* weight rows per cache block when many tokens share an expert */
/* one token's rows of llama.cpp block types per dot_tile call where they are at most
 * GGML_WIDE_MAX wide (ggml_dot_tile takes them four at a time): the call's fixed cost (type runs,
 * activation views, dispatch) once per 16 rows, 1.10x for 768-wide Q4_K rows from DRAM (Zen 4);
 * 2048-wide rows read 0.95x so, and keep four a call */
#define GGML_TILE_ROWS 16
#define GGML_WIDE_MAX 1024
/* Internal symbols shared between the kernel files, kept out of the library's exports. */
#define FT_HIDDEN __attribute__((visibility("hidden")))
/* Software prefetch of the same position in the rows of the next tile (tl_pf bytes further):
 * a tile reads its rows in lockstep, so prefetching one tile ahead keeps every stream fed. */
FT_HIDDEN extern __thread int64_t tl_pf;
#define PREFETCH(p) __builtin_prefetch((const char *)(p) + tl_pf, 0, 2)
/* The prefetch distance of a GEMV over rows of rs bytes in tiles of `tile` bytes: the next tile,
 * or as many whole rows as reach PF_MIN_BYTES ahead. Short rows need it: a tile of four 768-wide
 * Q4_K rows is 1.7 KB, too close for DRAM's latency at one core's rate (Zen 4, one thread, rows
 * streamed from DRAM: Q4_K / Q6_K rows of 768 read 1.3x faster with 6 KB, experts 1.03-1.08x;
 * tiles of 2048-wide rows, 4.6 KB, gained nothing from more). */
#define PF_MIN_BYTES 6144
static inline int64_t pf_distance(int64_t tile, int64_t rs) {
    return tile >= PF_MIN_BYTES ? tile : (PF_MIN_BYTES + rs - 1) / rs * rs;
}

typedef struct {
    int32_t fmt, act, H, I;
    float alpha, limit;
    int64_t n_experts;
    const uint8_t *gu_w; int64_t gu_w_es, gu_w_rs;   /* base, bytes per expert, bytes per row */
    const uint8_t *gu_s; int64_t gu_s_es, gu_s_rs;   /* scales (fp8: per 128 rows) */
    const uint8_t *dn_w; int64_t dn_w_es, dn_w_rs;
    const uint8_t *dn_s; int64_t dn_s_es, dn_s_rs;
    const float *gu_b, *dn_b;                        /* [N, 2I], [N, H] or NULL */
    /* the up rows in a bank of their own (ggml: a gate and an up type of different row widths),
     * NULL: rows I..2I-1 of gu_w; their scales stay rows I..2I-1 of gu_s */
    const uint8_t *up_w; int64_t up_w_es, up_w_rs;
} ft_desc;

/* ------------------------------------------------------------------ scalar helpers */

FT_HIDDEN extern float E8M0_HALF[256]; /* 2^(s-128): mxfp4 int8 lut holds 2*e2m1 */
FT_HIDDEN extern pthread_once_t tables_once;
FT_HIDDEN void init_tables(void);

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t f32_to_bf16(float f) {   /* round to nearest even, as vcvtneps2bf16 */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return s ? -f : f;
    }
    if (e == 31) u = s | 0x7f800000 | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}
/* e4m3fn byte -> fp32 bits of value * 2^-120 (exact, subnormals included). */
static inline float fp8_scaled(uint8_t b) {
    uint32_t u = ((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7f) << 20);
    float f; memcpy(&f, &u, 4); return f;
}
#define TWO_POW_120 1.329227995784916e+36f
/* nvfp4 scale row: e4m3 bytes per 16 columns, then the row's float32 global scale. */
static inline float nvfp4_global(const uint8_t *s, int n) {
    float g; memcpy(&g, s + n / 16, 4); return g;
}

/* Element k of a row of fp32 / bf16 / fp16 values (XT_F32/XT_BF16 share these codes). */
static inline float float_at(int fmt, const uint8_t *w, int64_t k) {
    if (fmt == FMT_F32) return ((const float *)w)[k];
    if (fmt == FMT_BF16) return bf16_to_f32(((const uint16_t *)w)[k]);
    return f16_to_f32(((const uint16_t *)w)[k]);
}

static inline int perm_bf16(int j, int n16) {  /* position of element j in the prepared vector */
#ifdef FT_AVX2
    if (j < n16) { int q = j & 15; return (j & ~15) + (q & 1) * 8 + (q >> 1); }
#endif
    (void)n16; return j;
}
/* mxfp4 activations: per pair of 32-blocks [even of b | even of b+1 | odd of b | odd of b+1]
 * (matching low / high nibbles of a 32-byte load of two blocks); an unpaired last block is
 * [even | odd]. */
static inline int perm_mxfp4(int j, int n) {
    int b = j >> 5, q = j & 31, nb = n >> 5;
    if ((nb & 1) && b == nb - 1) return (b << 5) + (q & 1) * 16 + (q >> 1);
    return ((b >> 1) << 6) + (q & 1) * 32 + (b & 1) * 16 + (q >> 1);
}

/* Prepared-activation layout for a vector of length n. */
static inline int64_t prep_bytes(int n) { return (int64_t)n * 4; }
FT_HIDDEN void prep_range(int fmt, const float *src, uint8_t *dst, int n, int j0, int j1);

#define FORCE_INLINE static inline __attribute__((always_inline))

#ifdef FT_AVX2
FORCE_INLINE float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}
#endif

/* Dots of 32 unsigned x 32 signed bytes into 8 int32 lanes (4 products each; dot2: two such
 * pairs summed): AVX512-VNNI's vpdpbusd where the CPU has it, else maddubs (pairs into int16)
 * + madd (pairs into int32). Equal results: our operands (|w| <= 128 with x in [-127, 127],
 * mxfp4's 0..24) never saturate maddubs' int16 pairs. */
#ifdef FT_AVX2
#if defined(FT_AVX512) && defined(__AVX512VNNI__)
#define FT_VNNI 1
FORCE_INLINE __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
FORCE_INLINE __m256i dot2_u8s8(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
}
#else
FORCE_INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
FORCE_INLINE __m256i dot2_u8s8(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)),
                             _mm256_set1_epi16(1));
}
#endif
#ifdef FT_AVX512
FORCE_INLINE __m512 exp16(__m512 x) {   /* exp(x), x <= 88 (Cephes expf: range reduction by ln2, degree-5 polynomial; ~1 ulp) */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654475f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
/* Rows of 16 32-bit pairs r[0..15] -> their transpose at dst (row i: pair i of the 16 rows). */
FORCE_INLINE void t16x16(__m512i *r, uint16_t *dst) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int b = 0; b < 16; b += 4) {
        r[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
        r[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
        r[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
        r[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i p0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), p1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
        const __m512i p2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44), p3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
        _mm512_storeu_si512(dst + (0 + c) * 32, _mm512_shuffle_i32x4(p0, p2, 0x88));
        _mm512_storeu_si512(dst + (4 + c) * 32, _mm512_shuffle_i32x4(p0, p2, 0xDD));
        _mm512_storeu_si512(dst + (8 + c) * 32, _mm512_shuffle_i32x4(p1, p3, 0x88));
        _mm512_storeu_si512(dst + (12 + c) * 32, _mm512_shuffle_i32x4(p1, p3, 0xDD));
    }
}

FORCE_INLINE __m512i dot512_u8s8(__m512i u, __m512i s) {   /* dot_u8s8 on 64 byte pairs */
#ifdef FT_VNNI
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}
#endif
#endif

/* llama.cpp's block types the ggml kernels read (ggml's type ids; layouts in quant/ggml_quants.py) */
enum { GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7, GT_Q8_0 = 8, GT_Q2_K = 10, GT_Q3_K = 11,
       GT_Q4_K = 12, GT_Q5_K = 13, GT_Q6_K = 14, GT_IQ4_NL = 20, GT_TQ1_0 = 34, GT_TQ2_0 = 35, GT_MXFP4 = 39 };
/* Bytes of 256 elements of `type` (8 blocks of 32 or one super-block), 0 for a type without
 * kernels. One entry per type: ggml.c's decode switch and ggml_dense.c's rows cover the same. */
static inline int ggml_bytes256(int type) {
    switch (type) {
    case GT_Q4_0: return 144;   case GT_Q4_1: return 160;  case GT_Q5_0: return 176;
    case GT_Q5_1: return 192;   case GT_Q8_0: return 272;  case GT_IQ4_NL: return 144;
    case GT_MXFP4: return 136;  case GT_Q2_K: return 84;   case GT_Q3_K: return 110;
    case GT_Q4_K: return 144;   case GT_Q5_K: return 176;  case GT_Q6_K: return 210;
    case GT_TQ1_0: return 54;   case GT_TQ2_0: return 66;
    default: return 0;
    }
}
/* Types in blocks of 32 (rows of any multiple of 32); the others have 256-element super-blocks. */
static inline int ggml_blocks32(int type) {
    return type == GT_Q4_0 || type == GT_Q4_1 || type == GT_Q5_0 || type == GT_Q5_1 || type == GT_Q8_0
        || type == GT_IQ4_NL || type == GT_MXFP4;
}

/* ggml.c: llama.cpp block types (FMT_GGML), the type of each row read through its scale pointer */
FT_HIDDEN void ggml_prep(const float *src, uint8_t *dst, int n, int j0, int j1);
FT_HIDDEN void ggml_dot_tile(const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                             const uint8_t *const *xp, int nt, float (*res)[NTMAX]);
/* ggml_iq.c: the lattice i-quants (IQ1_S .. IQ3_S); each returns 0 for a type not its own */
FT_HIDDEN int ggml_iq_type(int type);
FT_HIDDEN int ggml_iq_row(int type, const uint8_t *w, int n, const uint8_t *const *xp, int nt, float *res);
FT_HIDDEN int ggml_iq_dequant_row(int type, const uint8_t *w, int K, float *out);
/* The prefill tiles over ggml experts (ggml_tiles.c): each weight row decoded ONCE per call into a
 * per-thread bf16 panel that gemm_bf16.c's tiles multiply with all of an expert's tokens.
 * ggml_row_bf16 (ggml.c) / ggml_iq_row_bf16 (ggml_iq.c): one row of K elements -> K bf16, the
 * values gguf.quants.dequantize gives rounded to nearest even; 0 for a type not theirs. */
FT_HIDDEN int ggml_row_bf16(int type, const uint8_t *w, int K, uint16_t *dst);
FT_HIDDEN int ggml_iq_row_bf16(int type, const uint8_t *w, int K, uint16_t *dst);
FT_HIDDEN extern int ft_ggml_tiles, ft_ggml_group_min;
FT_HIDDEN void ggml_panel(int type, const uint8_t *w, int64_t rs, int r0, int r1, int K, uint16_t *pan);
#ifdef FT_AVX2
/* 32 int8 codes c -> 32 bf16 at dst: element i = s[i / 16] * c_i - o[i / 16] (one rounding in
 * fp32, then to bf16 nearest even; decoded weights are finite) */
FORCE_INLINE void codes_bf16(__m256i c, float s0, float s1, float o0, float o1, uint16_t *dst) {
#if defined(FT_AVX512) && defined(__AVX512BF16__)
    const __m512 lo = _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c))),
                                      _mm512_set1_ps(s0), _mm512_set1_ps(o0));
    const __m512 hi = _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(c, 1))),
                                      _mm512_set1_ps(s1), _mm512_set1_ps(o1));
    _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
#else
    for (int q = 0; q < 4; q++) {
        const __m128i b = q < 2 ? _mm256_castsi256_si128(c) : _mm256_extracti128_si256(c, 1);
        const __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q & 1 ? _mm_srli_si128(b, 8) : b)),
                                         _mm256_set1_ps(q < 2 ? s0 : s1), _mm256_set1_ps(q < 2 ? o0 : o1));
        __m256i u = _mm256_castps_si256(v);
        u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)))), 16);
        _mm_storeu_si128((__m128i *)(dst + 8 * q),
                         _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
    }
#endif
}
#endif
/* ggml_act.c: llama.cpp's fp16 activation scales and block sums in ggml_prep when on */
FT_HIDDEN extern int ft_ggml_act_llama;
FT_HIDDEN float ggml_round_f16(float f);
/* ggml_act.c: per-256 activations (llama.cpp's Q8_K layout) for the k-quant rows when ft_ggml_k256:
 * at byte K256_AT(n) of a ggml prep, int8 q[n] | float d[n / 256] | int16 sums per 16 [n / 16] */
FT_HIDDEN extern int ft_ggml_k256;
#define K256_AT(n) ((int64_t)(n) / 4 * 7)
FT_HIDDEN void ggml_prep256(const float *src, uint8_t *dst, int n);
/* ggml_dense.c: one row of a ggml type -> fp32, as gguf.quants.dequantize */
FT_HIDDEN void ggml_dequant_row(int type, const uint8_t *w, int K, float *out);
/* bf16 weights with bf16-rounded activations (bf16dot.c): on when ft_bf16_dot_on. */
FT_HIDDEN extern int ft_bf16_dot_on;
FT_HIDDEN void prep_bf16_pairs(const float *src, uint8_t *dst, int n, int j0, int j1);
#ifdef FT_BF16DOT
FT_HIDDEN void dot_tile_bf16_pairs(const uint8_t *const *wr, int R, int n, const uint8_t *const *xp, int nt,
                                   float (*res)[NTMAX]);
/* dense.c's GEMV rows: up to BW_TOK tokens a pass, BW_ROWS(tokens) rows (R x NT accumulators,
 * the R weight vectors and one token's within 31 of the 32 zmm registers): 4 rows x up to 6
 * tokens, 3 rows x 7-9. 9, not 6: on weights from 2 MiB pages, with 3-4 lines prefetched a step, a
 * verify of 7-9 rows in one pass over 3-row tiles took 0.87-0.93x the time of two passes over 4-row
 * tiles, 13-16 rows as two 3-row passes 0.91-0.95x three 4-row ones (Zen 4, one thread, a C loop
 * over 256 MiB of 2048-wide rows, 21 alternating rounds); with 2 lines a step, the count used
 * when 3-row passes were tried and dropped, the one 3-row pass is 1.03-1.09x */
#define BW_TOK 9
#define BW_ACC 27   /* the most accumulators of any shape: 3 x 9 (4 x 6 is 24) */
#define BW_ROWS(nt) (30 / ((nt) + 1) < 4 ? 30 / ((nt) + 1) : 4)
FT_HIDDEN void dot_rows_bf16_pairs(const uint8_t *const *wr, int R, int n, const uint8_t *x, int64_t xs, int nt,
                                   float *res, int ldr, int pf_lines);
FT_HIDDEN int bf16_pairs_tokens(int64_t M);
#endif

/* gemm_bf16.c: prefill GEMM tiles over bf16 weights (AMX, vdpbf16ps, plain C), x packed in
 * blocks of 16 tokens [kpad(K)/2 pairs][16][2] bf16 */
enum { FT_GEMM_AMX = 1, FT_GEMM_VDPBF16PS = 2, FT_GEMM_REF = 3 };
static inline int64_t kpad(int K) { return (int64_t)(K + 31) / 32 * 32; }
static inline int64_t blk_bytes(int K) { return kpad(K) * 32; }   /* one packed block of 16 tokens */
/* bf16 elements of the AMX tiles' per-thread scratch: two A sub-panels of 32 rows x 256 columns
 * (8 steps of 32 columns) used in turn, 9 steps apart (18 KB: the copy's stores into one never
 * alias the tile loads from the other on 4 KB offsets) */
#define GEMM_PAD_STEP 9
static inline int64_t gemm_pad_elems(void) { return 32 * 32 * (GEMM_PAD_STEP + 8); }
FT_HIDDEN extern int ft_gemm_mode, ft_gemm_min;
int ft_amx_ready(void);
#ifdef FT_AMX
FT_HIDDEN void amx_config(void);
#endif
FT_HIDDEN int gemm_mode_runs(int mode, int K);
FT_HIDDEN int gemm_chunk_tokens(int K);
FT_HIDDEN void gemm_pack(const float *const *rows, int m0, int M, int K, int c0, int c1, uint16_t *dst);
FT_HIDDEN void gemm_rows(int mode, const uint8_t *w, int64_t w_rs, int n0, int n1, int K, const uint16_t *xp,
                         int M, float *out, int64_t ldo, uint16_t *pad, const float *bias, int stream);

/* attention_blocks.c: the block loops of decode attention (attention.c) */
enum { ATT_Q_F32 = 0, ATT_Q_ROUNDED = 1, ATT_Q_BF16 = 2, ATT_Q_LANES = 3 };   /* att_prep_q's output (LANES: attention_lanes.c's) */
FT_HIDDEN void att_prep_q(const float *q, int G, int D, int Dp, float *qf, int mode);
#ifdef FT_BF16DOT
FT_HIDDEN void att_scores_block_bf16(const uint16_t *const *rows, int64_t nb, int G, int D, int Dp,
                                     const uint16_t *qb, float scale, float *sc);
/* attention_lanes.c: a verify's rows x G heads as the lanes of one score tile (G 8 or 16, D even) */
FT_HIDDEN int att_lanes_width(int n);
FT_HIDDEN void att_lanes_prep(const float *q, int64_t row_stride, int R, int G, int D, uint32_t *qt);
FT_HIDDEN void att_scores_lanes(const uint32_t *const *kp, int64_t nb, int R, int G, int D, const uint32_t *qt,
                                float scale, float *sc, int64_t stride);
#endif
FT_HIDDEN void att_scores_block(const float *const *rows, int64_t nb, int G, int D, int Dp, const float *qf,
                                float scale, float *sc);
FT_HIDDEN void att_softmax(float *sc, int64_t n, int G, float *m, float *l);
/* att_values_block's kvt beside XT_F32/XT_BF16: bf16 rows, weights rounded to bf16 (vdpbf16ps) */
#define ATT_KV_BF16P 2
FT_HIDDEN void att_values_block(const uint8_t *const *vr, int kvt, float *p, int64_t nb, int G, int D, int Dp,
                                float *acc);
/* att_values_block for the R rows of a verify on one block of V rows: row r's weights and
 * accumulators at p + r * stride and acc + r * stride, its keys nr[r] - b of the block (if any) */
FT_HIDDEN void att_values_rows(const uint8_t *const *vr, int kvt, int64_t nb, int64_t b, const int64_t *nr, int R,
                               int G, int D, int Dp, float *p, int64_t stride, float *acc);
FT_HIDDEN int att_col(int kvt, int G, int pos);
/* attention_amx.c: one item's scores and values on AMX tiles (bf16 caches, when ft_att_amx) */
FT_HIDDEN extern int ft_att_amx;
#ifdef FT_AMX
FT_HIDDEN int64_t att_amx_ws_bytes(int R, int G, int Dp, int64_t chunk);
FT_HIDDEN float *att_amx_item(const float *q, int64_t q_rs, int R, int G, int D, int Dp, const uint8_t *k,
                              const uint8_t *v, int64_t row_bytes, int64_t head_off, const int64_t *slots,
                              const int64_t *nr, int64_t n, int64_t chunk, float scale, void *ws, float *ml);
#endif

/* 1 where dot_tile runs fmt in tiles of 4 rows for any token count (AVX-512 float tiles, the int8 zmm tiles). */
FT_HIDDEN int wide_tiles(int fmt);
FT_HIDDEN void dot_tile(int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                        const uint8_t *const *xp, int nt, float (*res)[NTMAX]);
/* int8_zmm.c: the int8 / mxfp4 tiles in zmm registers (the ymm tiles' bits), on when ft_int8_zmm;
 * returns 0 for another format or a build without AVX-512 */
FT_HIDDEN extern int ft_int8_zmm;
FT_HIDDEN int int8_zmm_tile(int fmt, const uint8_t *const *wr, const uint8_t *const *sr, int R, int n,
                            const uint8_t *const *xp, int nt, float (*res)[NTMAX]);
static inline int int8_zmm_on(int fmt) {
#ifdef FT_AVX512
    return ft_int8_zmm && (fmt == FMT_INT8 || fmt == FMT_MXFP4);
#else
    (void)fmt;
    return 0;
#endif
}

/* ------------------------------------------------------------------ thread pool */

typedef struct ft_pool ft_pool;
typedef void (*job_fn)(void *arg, int tid);

struct ft_pool {
    int n;
    int active;         /* threads taking part in the current job: n, or 1 for small jobs */
    pthread_t *th;
    _Atomic int gen, done, stop, sleepers;
    _Atomic int park;   /* set by ft_pool_park: idle workers sleep now, not after spin_ns */
    job_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int bar_count, bar_gen;
    int64_t spin_ns, small_bytes;
    uint8_t *scratch;
    size_t scratch_cap;
};

FT_HIDDEN void pool_barrier(ft_pool *p);
FT_HIDDEN void pool_run_sized(ft_pool *p, job_fn fn, void *arg, int64_t bytes);
FT_HIDDEN void pool_run(ft_pool *p, job_fn fn, void *arg);
FT_HIDDEN uint8_t *scratch(ft_pool *p, size_t bytes);

/* ------------------------------------------------------------------ dense GEMV (dense.c)
 * The one decode driver of ft_linear_run (a strided matrix in a format above) and
 * ft_ggml_linear_run (ggml_dense.c: segments of llama.cpp block types). */

typedef struct {        /* rows of one ggml type at a fixed byte stride (a tensor of the GGUF file) */
    const uint8_t *w;   /* first row */
    int64_t rs;         /* bytes from one row to the next */
    int32_t type;       /* ggml type id of every row */
    int32_t rows;
} ft_gseg;

typedef struct {        /* where the weight rows are */
    int fmt;                          /* the dot tile and the activations' layout */
    const uint8_t *w; int64_t w_rs;   /* seg NULL: row r at w + r w_rs, its scales scale_row(fmt, s, ..) */
    const uint8_t *s; int64_t s_rs;
    const ft_gseg *seg; int nseg;     /* else the segments' rows in turn, a row's type as its scale */
} ft_gemv_rows;

/* y [M, ldy] (columns 0..N-1) = x [M, K] (XT_F32/XT_BF16) @ W^T (+ bias); `bytes` of weights
 * decide whether the pool runs it on one thread. 0, or -2 when the scratch cannot be allocated. */
FT_HIDDEN int gemv_run(ft_pool *p, const ft_gemv_rows *W, int N, int K, const void *x, int xt, int64_t M,
                       const float *bias, float *y, int64_t ldy, int64_t bytes);
/* amx_gemv.c: the decode GEMV over bf16 weights on AMX tiles, on when ft_gemv_amx (dense.c asks) */
FT_HIDDEN extern int ft_gemv_amx;
FT_HIDDEN int amx_gemv_run(ft_pool *p, const uint8_t *w, int64_t w_rs, int N, int K, const void *x, int xt,
                           int64_t M, const float *bias, float *y, int64_t ldy, int64_t bytes);

/* ------------------------------------------------------------------ work split helpers */

static inline const uint8_t *scale_row(int fmt, const uint8_t *base, int64_t es, int64_t rs, int64_t e, int r) {
    if (!base) return NULL;
    if (fmt == FMT_GGML) return base + e * es + 4 * (r / rs);   /* int32 type per rs rows */
    return base + e * es + (int64_t)(fmt == FMT_FP8 ? r / 128 : r) * rs;
}

static inline void split(int n, int unit, int nth, int tid, int *lo, int *hi) {
    int units = (n + unit - 1) / unit;
    int per = (units + nth - 1) / nth;
    int a = tid * per * unit, b = (tid + 1) * per * unit;
    *lo = a < n ? a : n; *hi = b < n ? b : n;
}

#endif /* FT_KERNELS_H */
