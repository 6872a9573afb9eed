/* Routing top-k of a decode step in one call: softmax over the router logits, the k largest
 * (ties: the lower expert id first), optionally renormalised over the k, or (after = 1) the top-k
 * of the logits with the softmax over those k only (gpt-oss). Replaces five torch ops (softmax,
 * topk, sum, div, to), each ~5-10 us of dispatch on a decode step's few rows. */
#include "ft_kernels.h"

/* noipa: ft_moe_decode (moe.c) runs this very body, no copy that could round differently */
__attribute__((noipa)) void ft_route_topk(const float *logits, int64_t T, int E, int k, int norm, int after, int64_t *ids, float *w) {
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        int64_t *id = ids + t * k;
        float *wt = w + t * k;
        float m = -INFINITY;
        for (int e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
        /* selection of the k largest logits (softmax is monotonic), k small: insertion */
        int n = 0;
        for (int e = 0; e < E; e++) {
            const float v = l[e];
            if (n == k && !(v > l[id[k - 1]])) continue;
            int p = n < k ? n++ : k - 1;
            while (p > 0 && v > l[id[p - 1]]) { id[p] = id[p - 1]; p--; }
            id[p] = e;
        }
        /* as torch computes it: p = exp(l - max) / sum, then p / sum of the k p's */
        float s = 0.f;
        if (!after)
            for (int e = 0; e < E; e++) s += expf(l[e] - m);
        for (int j = 0; j < k; j++) wt[j] = expf(l[id[j]] - m);
        if (after) {
            float sk = 0.f;
            for (int j = 0; j < k; j++) sk += wt[j];
            for (int j = 0; j < k; j++) wt[j] /= sk;
            continue;
        }
        float sp = 0.f;
        for (int j = 0; j < k; j++) { wt[j] /= s; sp += wt[j]; }
        if (norm)
            for (int j = 0; j < k; j++) wt[j] /= sp;
    }
}
