#include "ft_kernels.h"

/* ------------------------------------------------------------------ RMSNorm rows
 * out[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)) for fp32 rows of length n, in the calling thread
 * (decode rows are a few KB: a thread hand-off would cost more than the work). */
void ft_rms_norm(const float *x, const float *w, int64_t rows, int n, float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        float ss = 0.f;
        int i = 0;
#ifdef FT_AVX2
        __m256 a = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) { __m256 v = _mm256_loadu_ps(xr + i); a = _mm256_fmadd_ps(v, v, a); }
        ss = hsum8(a);
#endif
        for (; i < n; i++) ss += xr[i] * xr[i];
        const float inv = 1.f / sqrtf(ss / (float)n + eps);
        for (i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* ------------------------------------------------------------------ rotary embedding (NeoX halves)
 * out[t, h, i] = x*cos + rotate_half(x)*sin over the first `rot` of D columns (rest copied),
 * cos/sin rows [T, rot]; in the calling thread (a decode step's q/k are a few KB). */
void ft_rope(const float *x, const float *cos, const float *sin, int64_t T, int H, int D, int rot, float *out) {
    const int half = rot / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * rot, *s = sin + t * rot;
        for (int h = 0; h < H; h++) {
            const float *xr = x + (t * H + h) * D;
            float *o = out + (t * H + h) * D;
            for (int i = 0; i < half; i++) o[i] = xr[i] * c[i] - xr[i + half] * s[i];
            for (int i = half; i < rot; i++) o[i] = xr[i] * c[i] + xr[i - half] * s[i];
            for (int i = rot; i < D; i++) o[i] = xr[i];
        }
    }
}
