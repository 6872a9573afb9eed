#include <time.h>
#include "ft_kernels.h"

/* ------------------------------------------------------------------ a decode row through every layer
 * ft_layers_row: one decode row through a stack of decoder layers whose every layer takes the
 * two layer-sized calls (attn_half.c): for each layer, ft_attn_half, then ft_moe_row on that
 * layer's rows, its output the next layer's input; then the model's final RMSNorm. The very
 * calls the per-layer path makes, in the same order on the same operands: the same bits. What
 * it saves is the Python between them (~25 + ~80 us a layer on a medium shape's step once the
 * kernels have streamed their megabytes through the caches: `steptax4` in docs/benchmarks.md).
 * A sliding-window layer (gpt-oss) keeps its keys in the sequence's ring instead of the paged
 * cache: its ft_attn_half takes the ring's rows (`ft_ring_args`), as its per-layer call does. */

typedef struct ft_attn_layer ft_attn_layer;
int ft_attn_half(void *pool, const ft_attn_layer *L, const float *x, const float *cos, const float *sin,
                 const int64_t *slot, int64_t num_slots, void *kc, void *vc, int kvt,
                 const int64_t *key_slots, int64_t kmax, const int64_t *nkeys, float *h, float *normed,
                 double *att_seconds);
void ft_rms_norm(const float *x, const float *w, int64_t rows, int n, float eps, float *out);
int ft_moe_row(void *vp, const ft_desc *d, const float *logits, int E, int k, int norm, int after, int64_t offset,
               const void *x, int xt, int64_t *ids, int64_t *flat, float *w, float *out, const float *residual,
               float *sum, int64_t *counts);

/* One layer's two calls' arguments (all 8-byte fields: the Python mirror,
 * layers/attention/decode_stack.py, lays them out the same); `distinct` and `moe_seconds` are
 * written back: ft_moe_row's result and its wall time. */
typedef struct {
    const ft_attn_layer *L;
    int64_t num_slots; void *kc, *vc; int64_t kvt;
    float *h, *normed;
    const ft_desc *d; const float *logits; int64_t E, k, norm, after, offset;
    int64_t *ids, *flat; float *w, *out; int64_t *counts;
    float *sum;
    int64_t distinct; double moe_seconds;
    int64_t ring;           /* -1: keys in the paged cache above; else this layer's index in the ring */
} ft_row_layer;

/* A step's sliding-window ring (layers/attention/decode_half.ring_args): the new row's ring row,
 * the ring's rows a layer, k and v of its layer 0 and one layer's bytes, the kv type, the
 * window's rows oldest first, their count, and a pointer to that count. */
typedef struct {
    const int64_t *slot; int64_t rows; char *k, *v; int64_t layer_bytes, kvt;
    const int64_t *key_slots; int64_t kmax; const int64_t *nkeys;
} ft_ring_args;

static double seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* x [hidden] through layers[0..n); the last layer's `sum` holds the result, and with norm_w the
 * model's final RMSNorm of it is in normed (ft_rms_norm, as `rms_norm` calls it); ring: the
 * step's ring where some layer's `ring` is set, else NULL. Returns 0, or
 * (1 + the failing layer) * 16 + code: code 1..3 ft_attn_half's -1..-3, code 4..5 ft_moe_row's
 * -1..-2 (the layers before it ran, as the per-layer path leaves them). */
int ft_layers_row(void *pool, ft_row_layer *layers, int64_t n, const float *x, const float *cos, const float *sin,
                  const int64_t *slot, const int64_t *key_slots, int64_t kmax, const int64_t *nkeys,
                  double *att_seconds, const float *norm_w, int hidden, float eps, float *normed,
                  const ft_ring_args *ring) {
    for (int64_t i = 0; i < n; i++) {
        ft_row_layer *R = layers + i;
        int rc;
        if (R->ring >= 0) {
            int64_t off = R->ring * ring->layer_bytes;
            rc = ft_attn_half(pool, R->L, x, cos, sin, ring->slot, ring->rows, ring->k + off, ring->v + off,
                              (int)ring->kvt, ring->key_slots, ring->kmax, ring->nkeys, R->h, R->normed, att_seconds);
        } else {
            rc = ft_attn_half(pool, R->L, x, cos, sin, slot, R->num_slots, R->kc, R->vc, (int)R->kvt, key_slots, kmax,
                              nkeys, R->h, R->normed, att_seconds);
        }
        if (rc) return (int)(1 + i) * 16 - rc;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = ft_moe_row(pool, R->d, R->logits, (int)R->E, (int)R->k, (int)R->norm, (int)R->after, R->offset, R->normed,
                        0, R->ids, R->flat, R->w, R->out, R->h, R->sum, R->counts);
        R->moe_seconds = seconds_since(&t0);
        if (rc < 0) return (int)(1 + i) * 16 + 3 - rc;
        R->distinct = rc;
        x = R->sum;
    }
    if (norm_w) ft_rms_norm(x, norm_w, 1, hidden, eps, normed);
    return 0;
}
