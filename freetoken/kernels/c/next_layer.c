/* The history predictor's layer call (experts/memory/next_layer.py, one hop) in two C calls: its
 * count update and its guess, each ~60-70 us of numpy dispatch on the disk tier's decode thread
 * a layer call (issue 39: the tier's own work around the kernels). The same numbers as the numpy
 * code: the counts are float32 adds of 1 (a repeated id counted once, as numpy's fancy `+=`),
 * the estimate the same float64 divisions added in the same order. */
#include "ft_kernels.h"

static int seen_before(const int64_t *ids, int64_t i) {
    for (int64_t j = 0; j < i; j++)
        if (ids[j] == ids[i]) return 1;
    return 0;
}

static int out_of_range(const int64_t *ids, int64_t n, int64_t E) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= E) return 1;
    return 0;
}

/* pairs[a, b] += 1 for a in prev, b in ids; seen[a] += 1 (pairs: one layer's E x E, seen: its E).
 * Returns 0, or -1 (nothing counted) where an id is outside [0, E). */
int64_t ft_next_layer_observe(float *pairs, float *seen, const int64_t *prev, int64_t np_, const int64_t *ids,
                              int64_t n, int64_t E) {
    if (out_of_range(prev, np_, E) || out_of_range(ids, n, E)) return -1;
    for (int64_t i = 0; i < np_; i++) {
        if (seen_before(prev, i)) continue;
        const int64_t a = prev[i];
        seen[a] += 1.0f;
        for (int64_t j = 0; j < n; j++)
            if (!seen_before(ids, j)) pairs[a * E + ids[j]] += 1.0f;
    }
    return 0;
}

/* p[b] = (sum over a in ids, in order, of pairs[a, b] / max(seen[a], 1)) / n; out: the b with
 * p[b] >= thr, likeliest first, ties to the lower id. Returns how many (p: E doubles of scratch),
 * -1 where an id is outside [0, E). */
int64_t ft_next_layer_predict(const float *pairs, const float *seen, const int64_t *ids, int64_t n, int64_t E,
                              double thr, double *p, int64_t *out) {
    if (out_of_range(ids, n, E)) return -1;
    if (n <= 0) return 0;
    for (int64_t b = 0; b < E; b++) p[b] = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t a = ids[i];
        const float s = seen[a] > 1.0f ? seen[a] : 1.0f;
        const float *row = pairs + a * E;
        for (int64_t b = 0; b < E; b++) p[b] = i ? p[b] + (double)row[b] / (double)s : (double)row[b] / (double)s;
    }
    int64_t k = 0;
    for (int64_t b = 0; b < E; b++) {
        p[b] /= (double)n;
        if (!(p[b] >= thr)) continue;
        int64_t q = k++;                   /* insertion: p descending, then the id ascending */
        while (q > 0 && p[out[q - 1]] < p[b]) { out[q] = out[q - 1]; q--; }
        out[q] = b;
    }
    return k;
}
