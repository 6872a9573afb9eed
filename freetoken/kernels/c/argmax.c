#include <stdint.h>

/* ------------------------------------------------------------------ greedy decoding's argmax
 * ft_argmax: the index of the first maximum of x[0..n), or -1 where x holds a NaN (the caller
 * then masks NaNs: engine/sampler.greedy_tokens). One C call instead of the ~7 numpy calls it
 * replaces on a decode step's logits row (~0.1 ms of one core's step once the kernels have
 * flushed the interpreter from the caches; `step38` in docs/benchmarks.md). */
int64_t ft_argmax(const float *x, int64_t n) {
    if (n <= 0) return -1;
    float m = x[0];
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {           /* the maximum and whether any value is NaN */
        float v = x[i];
        nan |= v != v;
        m = v > m ? v : m;
    }
    if (nan) return -1;
    for (int64_t i = 0; i < n; i++)              /* its first index (-0.0 == 0.0, as numpy compares) */
        if (x[i] == m) return i;
    return -1;
}
