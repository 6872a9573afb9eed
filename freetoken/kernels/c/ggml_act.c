/* How the ggml layers round their activations (a run-time switch, ft_set_ggml_act):
 *   0 ("q8", default): per 32, int8 codes q = round(x / d) with d = amax / 127 kept in fp32, and
 *      the block sums d * sum(q) exact in fp32 (the GEMV; prefill GEMMs take exact activations);
 *   1 ("llama"): the same codes, but d and the block sums stored in fp16 as ggml-cpu's
 *      quantize_row_q8_0 / q8_1 store them (d rounded to fp16; s = fp16(d * sum q) with d
 *      unrounded), so a Q8_0 / Q4_0 / Q4_1 / Q5_x dot rounds as llama.cpp's vec_dot does;
 *   2 ("float32"): no rounding: layers/ggml_linear.py sends every call, decode included, through
 *      its dequantize + fp32 GEMM path (this library's prep is then not used by them).
 * ggml.c's ggml_prep reads the switch; layers/ggml_linear.py rounds prefill activations the
 * same way (its torch GEMM then multiplies exactly those values). */
#include "ft_kernels.h"

int ft_ggml_act_llama;
int ft_ggml_act_mode;      /* 0 q8, 1 llama, 2 float32 (switches.c reads it too) */

/* mode 0, 1 or 2 sets the switch, -1 only reads it; returns the mode in effect */
int ft_set_ggml_act(int mode) {
    if (mode >= 0 && mode <= 2) ft_ggml_act_mode = mode;
    ft_ggml_act_llama = ft_ggml_act_mode == 1;
    return ft_ggml_act_mode;
}

/* f rounded to the nearest fp16 value (ties to even, subnormals included, overflow to inf),
 * returned as fp32; portable (no F16C). */
float ggml_round_f16(float f) {
    const float a = fabsf(f);
    if (!(a > 0.f)) return f;                       /* 0 or NaN */
    if (a >= 65520.f) return copysignf(INFINITY, f);
    int e;
    frexpf(a, &e);                                  /* a in [2^(e-1), 2^e) */
    const float quantum = ldexpf(1.f, e < -13 ? -24 : e - 11);   /* 11 significant bits, 2^-24 below 2^-14 */
    return copysignf(nearbyintf(a / quantum) * quantum, f);
}

/* Per-256 activations for the k-quant rows (Q2_K .. Q6_K) of the dots, llama.cpp's Q8_K layout:
 * per 256, int8 q = round(x / d) with d = amax / 127 in fp32, and the int16 sums of q per 16, so a
 * super-block's 8 (or 16) integer sums are scaled by its integer sub-scales and summed in integer,
 * its mins taken off with the sums, and one convert + fma per 256 weights (ggml.c's krow).
 * Coarser than the per-32 codes (one scale for 256 values), as coarse as llama.cpp's own
 * k-quant dots. ft_ggml_k256 (ft_set_ggml_k256; off by default) makes prep_range write it after
 * the per-32 prep of a whole vector, and the dots read it; the engine switches it on per the
 * calibrated choice (kernels/ggml_k256.py) under ggml_numerics "auto" only. */
int ft_ggml_k256;

/* 1 on, 0 off, -1 only reads; returns the switch in effect */
int ft_set_ggml_k256(int on) {
    if (on >= 0) ft_ggml_k256 = on != 0;
    return ft_ggml_k256;
}

/* src[0..n) (n a multiple of 256) -> the per-256 part of dst (a ggml prep of n elements) */
void ggml_prep256(const float *src, uint8_t *dst, int n) {
    int8_t *q = (int8_t *)(dst + K256_AT(n));
    float *d = (float *)(q + n);
    int16_t *bs = (int16_t *)(d + n / 256);
    for (int b = 0; b < n / 256; b++) {
        const float *x = src + 256 * b;
        float amax = 0.f;
        for (int i = 0; i < 256; i++) { float a = fabsf(x[i]); amax = a > amax ? a : amax; }
        const float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
        d[b] = dd;
#ifdef FT_AVX2   /* the same codes: x id rounded half to even (nearbyintf's mode), 16 at a time */
        const __m256 vid = _mm256_set1_ps(id);
        for (int g = 0; g < 16; g++) {
            const int r = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            const __m256i a = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * g), vid), r));
            const __m256i c = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * g + 8), vid), r));
            const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, c), 0xD8);   /* 16 int16 in order */
            _mm_storeu_si128((__m128i *)(q + 256 * b + 16 * g),
                             _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
            const __m256i s8 = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            bs[16 * b + g] = (int16_t)_mm_cvtsi128_si32(s4);
        }
#else
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) {
                const int v = (int)nearbyintf(x[i] * id);
                q[256 * b + i] = (int8_t)v;
                s += v;
            }
            bs[16 * b + g] = (int16_t)s;
        }
#endif
    }
}
