/* Peak multiply-add rates of this machine per number format (the roofline's compute ceilings):
 * every pool thread runs independent chains of one instruction long enough to hide its latency,
 * operands in registers, no memory traffic. The caller times the call; the return value is the
 * multiply-adds executed (-1: the format has no instruction in this build or on this CPU).
 *   FT_PEAK_FP32:      fp32 FMA (zmm with AVX-512, ymm with AVX2, scalar-vectorised C otherwise)
 *   FT_PEAK_BF16:      AVX512-BF16 vdpbf16ps (2 bf16 products per fp32 lane)
 *   FT_PEAK_INT8:      VNNI vpdpbusd (4 u8 x s8 products per int32 lane; zmm AVX512-VNNI); on an
 *                      AVX2 build the pre-VNNI sequence the int8 dots use (vpmaddubsw, vpmaddwd by
 *                      ones, vpaddd: 32 u8 x s8 products per ymm), so an AVX2 CPU's int8 formats
 *                      are not read against the fp32 FMA peak, which that sequence exceeds
 *   FT_PEAK_AMX_BF16:  AMX tdpbf16ps, 16x16x32 per tile op (where the OS grants the tiles)
 *   FT_PEAK_AMX_INT8:  AMX tdpbssd, 16x16x64 per tile op
 * ft_peak_bursts times each thread's bursts on that thread's own CPU clock after a warm-up burst
 * (the AMX unit powers up and the clock settles first; another process holding the core is not
 * counted), and ft_core_hz measures each thread's clock by a chain of dependent imuls (3 cycles
 * each on every x86-64 since Nehalem / Zen): the probe's FLOP per cycle checks it against the
 * instruction's own rate (a TDPBF16PS is 1024 FLOP per cycle per core). */
#include "ft_kernels.h"

#if defined(FT_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__linux__)
#define FT_AMX_PEAK 1
#endif

enum { FT_PEAK_FP32 = 0, FT_PEAK_BF16 = 1, FT_PEAK_INT8 = 2, FT_PEAK_AMX_BF16 = 3, FT_PEAK_AMX_INT8 = 4 };
int ft_amx_ready(void);   /* gemm_bf16.c (exported) */

typedef struct { int kind; int64_t iters; double *sink; int64_t *macs; ft_pool *p; int bursts; double *secs; } peak_job;

#define CHAINS 16   /* > 2 ports x 4-6 cycles of latency (vdpbf16ps' too); 16 + 2 zmm registers */

static int64_t run_fp32(int64_t iters, double *sink) {
#ifdef FT_AVX512
    __m512 a[CHAINS], m = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    for (int i = 1; i < CHAINS; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    *sink += _mm512_reduce_add_ps(a[0]);
    return iters * CHAINS * 16;
#elif defined(FT_AVX2)
    __m256 a[CHAINS], m = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    for (int i = 1; i < CHAINS; i++) a[0] = _mm256_add_ps(a[0], a[i]);
    *sink += hsum8(a[0]);
    return iters * CHAINS * 8;
#else
    float a[CHAINS * 8];
    for (int i = 0; i < CHAINS * 8; i++) a[i] = (float)i;
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS * 8; i++) a[i] = a[i] * 1.0000001f + 1e-7f;
    for (int i = 0; i < CHAINS * 8; i++) *sink += a[i];
    return iters * CHAINS * 8;
#endif
}

static int64_t run_bf16(int64_t iters, double *sink) {
#ifdef FT_BF16DOT
    __m512 a[CHAINS];
    __m512bh u = (__m512bh)_mm512_set1_epi16(0x3380), v = (__m512bh)_mm512_set1_epi16(0x3380);   /* 6e-8 */
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], u, v);
    for (int i = 1; i < CHAINS; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    *sink += _mm512_reduce_add_ps(a[0]);
    return iters * CHAINS * 32;
#else
    (void)iters; (void)sink;
    return -1;
#endif
}

static int64_t run_int8(int64_t iters, double *sink) {
#if defined(FT_AVX512) && defined(__AVX512VNNI__)
    __m512i a[CHAINS], u = _mm512_set1_epi8(1), s = _mm512_set1_epi8(1);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbusd_epi32(a[i], u, s);
    for (int i = 1; i < CHAINS; i++) a[0] = _mm512_add_epi32(a[0], a[i]);
    *sink += (double)_mm512_reduce_add_epi32(a[0]);
    return iters * CHAINS * 64;
#elif defined(FT_AVX2) && !defined(FT_AVX512)
    /* 4 chains: each is one vpaddd deep per round; the asm keeps the products in the loop */
    __m256i a[4], u[4], s = _mm256_set1_epi8(1), one = _mm256_set1_epi16(1);
    for (int i = 0; i < 4; i++) { a[i] = _mm256_set1_epi32(i); u[i] = _mm256_set1_epi8((char)(i + 1)); }
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < 4; i++) {
            __asm__ volatile("" : "+x"(u[i]));
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u[i], s), one));
        }
    for (int i = 1; i < 4; i++) a[0] = _mm256_add_epi32(a[0], a[i]);
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)t, a[0]);
    *sink += (double)t[0];
    return iters * 4 * 32;
#else
    (void)iters; (void)sink;
    return -1;
#endif
}

#ifdef FT_AMX_PEAK
typedef struct { uint8_t palette, start; uint8_t rsv[14]; uint16_t colsb[16]; uint8_t rows[16]; } peak_cfg;
#endif

static int64_t run_amx(int kind, int64_t iters, double *sink) {
#ifdef FT_AMX_PEAK
    if (!ft_amx_ready()) return -1;
    peak_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) { c.colsb[i] = 64; c.rows[i] = 16; }
    _tile_loadconfig(&c);
    static __thread uint8_t src[1024] __attribute__((aligned(64)));
    float out[256];
    memset(src, 0, sizeof src);
    _tile_loadd(4, src, 64); _tile_loadd(5, src, 64); _tile_loadd(6, src, 64); _tile_loadd(7, src, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    if (kind == FT_PEAK_AMX_BF16) {
        for (int64_t it = 0; it < iters; it++) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
    } else {
        for (int64_t it = 0; it < iters; it++) {
            _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
        }
    }
    _tile_stored(0, out, 64);
    _tile_release();
    *sink += out[0];
    return iters * 4 * 16 * 16 * (kind == FT_PEAK_AMX_BF16 ? 32 : 64);
#else
    (void)kind; (void)iters; (void)sink;
    return -1;
#endif
}

static int64_t run_kind(int kind, int64_t iters, double *s) {
    switch (kind) {
    case FT_PEAK_FP32: return run_fp32(iters, s);
    case FT_PEAK_BF16: return run_bf16(iters, s);
    case FT_PEAK_INT8: return run_int8(iters, s);
    default: return run_amx(kind, iters, s);
    }
}

static void peak_fn(void *a, int tid) {
    peak_job *J = a;
    double s = 0;
    J->macs[tid] = run_kind(J->kind, J->iters, &s);
    J->sink[tid] = s;
}

/* this thread's CPU seconds (the wall clock where the OS has no per-thread clock) */
static double thread_s(void) {
    struct timespec t;
#ifdef CLOCK_THREAD_CPUTIME_ID
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
#else
    clock_gettime(CLOCK_MONOTONIC, &t);
#endif
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void burst_fn(void *a, int tid) {
    peak_job *J = a;
    double s = 0;
    int64_t n = run_kind(J->kind, J->iters, &s);       /* warm-up, untimed */
    for (int b = 0; b < J->bursts && n >= 0; b++) {
        double t = thread_s();
        run_kind(J->kind, J->iters, &s);
        J->secs[(int64_t)tid * J->bursts + b] = thread_s() - t;
    }
    J->sink[tid] = s;
    J->macs[tid] = n;
}

/* Multiply-adds executed by all pool threads running `iters` rounds of `kind`'s instruction
 * (the caller times it), or -1 where the format has no instruction here. */
int64_t ft_peak_macs(void *vp, int kind, int64_t iters) {
    ft_pool *p = vp;
    double sink[256] = {0};
    int64_t macs[256] = {0};
    peak_job J = {kind, iters, sink, macs, p};
    pool_run(p, peak_fn, &J);
    int64_t total = 0;
    for (int i = 0; i < p->n && i < 256; i++) {
        if (macs[i] < 0) return -1;
        total += macs[i];
    }
    volatile double keep = sink[0];
    (void)keep;
    return total;
}

/* Each pool thread: one warm-up burst of `iters` rounds, then `bursts` bursts, each timed on the
 * thread's own CPU clock into secs[tid * bursts + b]. Returns one thread's multiply-adds per
 * burst, or -1 where the format has no instruction here. */
int64_t ft_peak_bursts(void *vp, int kind, int64_t iters, int bursts, double *secs) {
    ft_pool *p = vp;
    double sink[256] = {0};
    int64_t macs[256] = {0};
    peak_job J = {kind, iters, sink, macs, p, bursts, secs};
    pool_run(p, burst_fn, &J);
    for (int i = 0; i < p->n && i < 256; i++)
        if (macs[i] < 0) return -1;
    volatile double keep = sink[0];
    (void)keep;
    return macs[0];
}

typedef struct { int64_t n; double *hz; } hz_job;

static void hz_fn(void *a, int tid) {
    hz_job *J = a;
#if defined(__x86_64__)
    uint64_t x = 3, m = 0x9E3779B97F4A7C15ull;
    double best = 0;
    for (int rep = 0; rep < 8; rep++) {
        double t = thread_s();
        for (int64_t i = 0; i < J->n; i++)     /* 8 dependent imuls: 24 cycles a round */
            __asm__ volatile("imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t"
                             "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0" : "+r"(x) : "r"(m));
        double dt = thread_s() - t;
        if (dt > 0 && 24.0 * (double)J->n / dt > best) best = 24.0 * (double)J->n / dt;
    }
    (void)x;
    J->hz[tid] = best;
#else
    J->hz[tid] = 0;     /* no cycle-exact chain in this build */
#endif
}

/* Each pool thread's clock (Hz, the best of 8 chains of n rounds of 8 dependent imuls; 0 where
 * this build has no such chain) into hz[tid]. */
void ft_core_hz(void *vp, int64_t n, double *hz) {
    hz_job J = {n, hz};
    pool_run((ft_pool *)vp, hz_fn, &J);
}
