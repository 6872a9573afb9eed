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
static int act_mode;

/* mode 0, 1 or 2 sets the switch, -1 only reads it; returns the mode in effect */
int ft_set_ggml_act(int mode) {
    if (mode >= 0 && mode <= 2) act_mode = mode;
    ft_ggml_act_llama = act_mode == 1;
    return act_mode;
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
