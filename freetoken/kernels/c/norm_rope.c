#include "ft_kernels.h"

/* ------------------------------------------------------------------ RMSNorm rows
 * out[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)) for fp32 rows of length n, in the calling thread
 * (decode rows are a few KB: a thread hand-off would cost more than the work). */
/* noipa: the fused calls below run this very body (no inlined copy contracting its sums
 * another way), so a fused step has the bits of the separate calls. */
__attribute__((noipa)) void ft_rms_norm(const float *x, const float *w, int64_t rows, int n, float eps, float *out) {
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
__attribute__((noipa)) void ft_rope(const float *x, const float *cos, const float *sin, int64_t T, int H, int D,
                                     int rot, float *out) {
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

/* ------------------------------------------------------------------ KV cache rows
 * kc[slots[t]] = k row t and vc[slots[t]] = v row t (vc NULL: K only), `row` fp32 values each at
 * row strides ks / vs, stored as the cache's fp32 or bf16 (rounded to nearest even, torch's
 * .to(bfloat16)); in the calling thread: a decode step's rows are a few KB, and one call replaces
 * the two conversions and two index copies of a layer. Returns -1 (nothing written) when a slot
 * is outside [0, num_slots). */
int ft_kv_write(const float *k, int64_t ks, const float *v, int64_t vs, int64_t n, int64_t row,
                const int64_t *slots, int64_t num_slots, void *kc, void *vc, int bf16) {
    for (int64_t t = 0; t < n; t++)
        if (slots[t] < 0 || slots[t] >= num_slots) return -1;
    for (int64_t t = 0; t < n; t++) {
        for (int which = 0; which < 2; which++) {
            const float *src = which ? v + t * vs : k + t * ks;
            void *dst = which ? vc : kc;
            if (!dst) continue;
            if (bf16) {
                uint16_t *d = (uint16_t *)dst + slots[t] * row;
                for (int64_t i = 0; i < row; i++) d[i] = f32_to_bf16(src[i]);
            } else {
                memcpy((float *)dst + slots[t] * row, src, (size_t)row * sizeof(float));
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ fused decode-step helpers
 * A decode layer's small ops as one call each, each the exact calls it replaces:
 * ft_add_rms_norm: h = x + a (fp32 rows [rows, n]), then out = ft_rms_norm(h) (the residual add
 * and the post-attention norm of a layer);
 * ft_norm_rope_qk: per row t of qkv (row stride `rs` floats), q's `heads` and k's `kv_heads`
 * head rows normed by ft_rms_norm (weights qw/kw; NULL: no norm), then ft_rope of the row's
 * heads + kv_heads into out [T, heads + kv_heads, D]. Returns -1 when its scratch row cannot
 * be allocated. */
void ft_add_rms_norm(const float *x, const float *a, const float *w, int64_t rows, int n, float eps, float *h,
                     float *out) {
    for (int64_t i = 0; i < rows * n; i++) h[i] = x[i] + a[i];
    ft_rms_norm(h, w, rows, n, eps, out);
}

int ft_norm_rope_qk(const float *qkv, int64_t rs, int64_t T, int heads, int kv_heads, int D, int rot,
                    const float *qw, float q_eps, const float *kw, float k_eps, const float *cos, const float *sin,
                    float *out) {
    const int H = heads + kv_heads;
    float *tmp = qw ? malloc((size_t)H * D * sizeof(float)) : NULL;
    if (qw && !tmp) return -1;
    for (int64_t t = 0; t < T; t++) {
        const float *src = qkv + t * rs;
        if (qw) {
            ft_rms_norm(src, qw, heads, D, q_eps, tmp);
            ft_rms_norm(src + (int64_t)heads * D, kw, kv_heads, D, k_eps, tmp + (int64_t)heads * D);
            src = tmp;
        }
        ft_rope(src, cos + t * rot, sin + t * rot, 1, H, D, rot, out + t * H * D);
    }
    free(tmp);
    return 0;
}
