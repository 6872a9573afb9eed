/* The slot table's first k victims (experts/memory/slots.py `candidates`, not arc, a few of a
 * large table) in one pass over the slots: the numpy path gathers, scores, samples, partitions
 * and lexsorts ~2400 slots for every layer call's few misses and read-ahead guesses (issue 39:
 * the largest item of the disk tier's Python on the decode thread). The same order as numpy's:
 * the free empty slots first, by slot; then the free used slots that are not kept, then the kept
 * ones (`kept` by flat id, NULL: none), each by (-next use where `L` > 0, score, stamp, slot)
 * ascending, the score read by owner (`score`, NULL: all 0; a NaN last, as numpy sorts it). */
#include <stdlib.h>
#include "ft_kernels.h"

typedef struct { int64_t group, far, stamp, slot; double score; } victim_key;

static int score_less(double a, double b) {
    return a < b || (b != b && a == a);
}

static int key_less(const victim_key *a, const victim_key *b) {
    if (a->group != b->group) return a->group < b->group;
    if (a->far != b->far) return a->far < b->far;
    if (a->score != b->score && (a->score == a->score || b->score == b->score)) return score_less(a->score, b->score);
    if (a->stamp != b->stamp) return a->stamp < b->stamp;
    return a->slot < b->slot;
}

/* out: up to k slots, first victim first; returns how many (-1: out of memory). `L` > 0: order by
 * next use (layer calls until the owner's layer comes round again after `cur`, a whole pass for
 * `cur` itself), furthest first. */
int64_t ft_slot_victims(int64_t capacity, const int64_t *owner, const int64_t *stamp, const int32_t *locks,
                        const uint8_t *pending, const double *score, const uint8_t *kept, int64_t L, int64_t E,
                        int64_t cur, int64_t k, int64_t *out) {
    int64_t n = 0;
    for (int64_t s = 0; s < capacity && n < k; s++)
        if (owner[s] < 0 && !locks[s] && !pending[s]) out[n++] = s;
    const int64_t m = k - n;
    if (m <= 0) return n;
    victim_key *best = malloc((size_t)m * sizeof(victim_key));
    if (!best) return -1;
    int64_t have = 0;
    for (int64_t s = 0; s < capacity; s++) {
        const int64_t f = owner[s];
        if (f < 0 || locks[s] || pending[s]) continue;
        victim_key key = {kept && kept[f] ? 1 : 0, 0, stamp[s], s, score ? score[f] : 0.0};
        if (L > 0) {
            int64_t d = ((f / E - cur) % L + L) % L;
            key.far = -(d ? d : L);
        }
        if (have == m && !key_less(&key, &best[m - 1])) continue;
        int64_t q = have < m ? have++ : m - 1;          /* insertion into the sorted best m */
        while (q > 0 && key_less(&key, &best[q - 1])) { best[q] = best[q - 1]; q--; }
        best[q] = key;
    }
    for (int64_t i = 0; i < have; i++) out[n++] = best[i].slot;
    free(best);
    return n;
}
