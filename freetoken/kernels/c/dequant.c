#include "ft_kernels.h"

/* ------------------------------------------------------------------ dequantization (prefill)
 * Rows [0, N) of W in any format -> fp32 [N, K], rows split over the pool: prefill runs big
 * GEMMs in torch, fed from weights that stay in their compact format in memory. */

typedef struct {
    int fmt, N, K;
    const uint8_t *w; int64_t w_rs;
    const uint8_t *s; int64_t s_rs;
    float *out; ft_pool *p;
} deq_job;

static const float E2M1_F[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                 -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

static void dequant_row(int fmt, const uint8_t *w, const uint8_t *s, int K, float *o) {
    switch (fmt) {
    case FMT_F32: memcpy(o, w, (size_t)K * 4); break;
    case FMT_BF16: for (int k = 0; k < K; k++) o[k] = float_at(FMT_BF16, w, k); break;
    case FMT_F16: for (int k = 0; k < K; k++) o[k] = float_at(FMT_F16, w, k); break;
    case FMT_FP8:
        for (int b0 = 0; b0 < K; b0 += 128) {
            const float sc = ((const float *)s)[b0 / 128] * TWO_POW_120;
            const int b1 = b0 + 128 < K ? b0 + 128 : K;
            for (int k = b0; k < b1; k++) o[k] = fp8_scaled(w[k]) * sc;
        }
        break;
    case FMT_INT8:
        for (int b = 0; b < K / 32; b++) {
            const float sc = f16_to_f32(((const uint16_t *)s)[b]);
            for (int k = 0; k < 32; k++) o[32 * b + k] = (float)((const int8_t *)w)[32 * b + k] * sc;
        }
        break;
    case FMT_NVFP4: {   /* (e2m1 * e4m3) * global: the first product is exact, as in quant/nvfp4.py */
        const float g = nvfp4_global(s, K);
        for (int b = 0; b < K / 16; b++) {
            const float sc = fp8_scaled(s[b]) * TWO_POW_120;
            for (int k = 0; k < 8; k++) {
                uint8_t v = w[8 * b + k];
                o[16 * b + 2 * k] = (E2M1_F[v & 15] * sc) * g;
                o[16 * b + 2 * k + 1] = (E2M1_F[v >> 4] * sc) * g;
            }
        }
        break;
    }
    case FMT_GGML: {   /* s: the int32 ggml type of this row (ggml_dense.c) */
        int32_t type; memcpy(&type, s, 4);
        ggml_dequant_row(type, w, K, o);
        break;
    }
    case FMT_MXFP4: {
        static const float E2M1[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                       -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
        for (int b = 0; b < K / 32; b++) {
            const float sc = 2.f * E8M0_HALF[s[b]];   /* 2^(s-127) */
            for (int k = 0; k < 16; k++) {
                uint8_t v = w[16 * b + k];
                o[32 * b + 2 * k] = E2M1[v & 15] * sc;
                o[32 * b + 2 * k + 1] = E2M1[v >> 4] * sc;
            }
        }
        break;
    }
    }
}

static void deq_fn(void *a, int tid) {
    deq_job *D = a;
    int r0, r1;
    split(D->N, 1, D->p->active, tid, &r0, &r1);
    for (int r = r0; r < r1; r++)
        dequant_row(D->fmt, D->w + (int64_t)r * D->w_rs, scale_row(D->fmt, D->s, 0, D->s_rs, 0, r),
                    D->K, D->out + (int64_t)r * D->K);
}

void ft_dequant_rows(void *vp, int fmt, const void *w, int64_t w_rs, const void *s, int64_t s_rs,
                     int N, int K, float *out) {
    ft_pool *p = vp;
    pthread_once(&tables_once, init_tables);
    deq_job D = {fmt, N, K, w, w_rs, s, s_rs, out, p};
    pool_run_sized(p, deq_fn, &D, (int64_t)N * K * 4);
}
