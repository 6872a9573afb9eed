/* llama.cpp's ggml_vec_dot_q4_1_q8_1 (ggml-cpu x86, AVX2 loop) bit for bit, for
 * ggml_numerics "llama-exact" (quant/ggml_exact.py prepares both operands): per block of 32,
 * 8 int32 lanes of 4 consecutive products, acc[lane] = fma(d_w * d_x, lane, acc[lane]) over the
 * blocks in order, summs = fma(m_w, s_x, summs), then hsum_float_8's halving sum + summs.
 * qx int8 [T, nb * 32], dx / sx float [T, nb] (fp16 values), qw int8 codes 0..15 [N, nb * 32],
 * dw / mw float [N, nb]; y [T, N] (row stride ldy). Rows [n0, n1) only: callers split N. */
#include "ft_kernels.h"

void ft_q4_1_exact(const int8_t *qx, const float *dx, const float *sx, int T, const int8_t *qw, const float *dw,
                   const float *mw, int n0, int n1, int nb, float *y, int64_t ldy) {
    for (int t = 0; t < T; t++) {
        const int8_t *xt = qx + (int64_t)t * nb * 32;
        for (int n = n0; n < n1; n++) {
            const int8_t *wn = qw + (int64_t)n * nb * 32;
            float acc[8] = {0}, summs = 0.f;
#ifdef FT_VNNI   /* vpdpbusd: lane l = the 4 products of bytes 4l..4l+3, as ggml's mul_sum_us8_pairs */
            __m256 vacc = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(wn + b * 32));
                const __m256i a = _mm256_loadu_si256((const __m256i *)(xt + b * 32));
                const __m256 lanes = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a));
                vacc = _mm256_fmadd_ps(_mm256_set1_ps(dw[(int64_t)n * nb + b] * dx[(int64_t)t * nb + b]), lanes, vacc);
                summs = fmaf(mw[(int64_t)n * nb + b], sx[(int64_t)t * nb + b], summs);
            }
            _mm256_storeu_ps(acc, vacc);
#else
            for (int b = 0; b < nb; b++) {
                const float dd = dw[(int64_t)n * nb + b] * dx[(int64_t)t * nb + b];
                for (int l = 0; l < 8; l++) {
                    const int8_t *a = xt + b * 32 + 4 * l, *w = wn + b * 32 + 4 * l;
                    const int lane = a[0] * w[0] + a[1] * w[1] + a[2] * w[2] + a[3] * w[3];
                    acc[l] = fmaf(dd, (float)lane, acc[l]);
                }
                summs = fmaf(mw[(int64_t)n * nb + b], sx[(int64_t)t * nb + b], summs);
            }
#endif
            float h4[4], h2[2];
            for (int i = 0; i < 4; i++) h4[i] = acc[i + 4] + acc[i];
            for (int i = 0; i < 2; i++) h2[i] = h4[i + 2] + h4[i];
            y[(int64_t)t * ldy + n] = (h2[1] + h2[0]) + summs;
        }
    }
}

/* out[m, n] = the dot of a[m, :K] and b[n, :K] (rows lda / ldb apart) as ggml sums an f16 dot
 * on AVX512 (its operands here are f16 values in fp32, so each product is exact), in one of two
 * orders: vec_dot = 0, llamafile's tinyBLAS GEMM (K a multiple of 16): 16 lanes, lane l += the
 * products l + 16c for c in order; vec_dot = 1, ggml_vec_dot_f16 (K a multiple of 64): four
 * 16-lane accumulators, accumulator j += the products 64i + 16j + l, then (0 + 2) + (1 + 3).
 * Either ends in _mm512_reduce_add_ps's halving sum (lanes l and l + 8, then l + 4, l + 2, l + 1). */
void ft_dot16_exact(const float *a, int64_t lda, const float *b, int64_t ldb, int M, int N, int K,
                    float *out, int64_t ldo, int vec_dot) {
    const int acc_n = vec_dot ? 4 : 1;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *x = a + m * lda, *y = b + n * ldb;
            float l16[4][16] = {{0}};
            for (int c = 0; c < K; c += 16 * acc_n)
                for (int j = 0; j < acc_n; j++) {
#ifdef FT_AVX512
                    const int o = c + 16 * j;
                    _mm512_storeu_ps(l16[j], _mm512_fmadd_ps(_mm512_loadu_ps(x + o), _mm512_loadu_ps(y + o),
                                                             _mm512_loadu_ps(l16[j])));
#else
                    for (int l = 0; l < 16; l++) l16[j][l] = fmaf(x[c + 16 * j + l], y[c + 16 * j + l], l16[j][l]);
#endif
                }
            if (vec_dot)
                for (int l = 0; l < 16; l++) l16[0][l] = (l16[0][l] + l16[2][l]) + (l16[1][l] + l16[3][l]);
            for (int h = 8; h >= 1; h /= 2)
                for (int l = 0; l < h; l++) l16[0][l] = l16[0][l] + l16[0][l + h];
            out[m * ldo + n] = l16[0][0];
        }
}
