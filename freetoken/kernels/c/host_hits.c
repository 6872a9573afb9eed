/* The host expert cache's layer call at full hits (experts/disk/host_cache.py `acquire_hits`,
 * `release_hits`) in one C call each: the numpy path gathers the call's slots, checks them,
 * locks them, gathers the unique ids' slots again, checks their order and the read-ahead's
 * marks, ~8 numpy calls, each several times its loop cost in situ (the kernels stream ~170 MB
 * of experts through the caches between two layer calls; issue 39: the tier's Python on the
 * decode thread). */
#include <stdlib.h>
#include "ft_kernels.h"

/* uniq: the call's unique flat ids, ascending (nu); flat: its routed ids (nf). ready_of: flat id
 * -> slot once landed, else -1. Returns -1 (nothing changed) when one of flat is not landed;
 * else slots[i] = ready_of[flat[i]], su[j] = ready_of[uniq[j]], each of su locked once (the
 * unique ids' slots are the distinct slots of flat), the read-ahead's marks (`prefetched`) of su
 * cleared, and returns (the marks cleared) * 2 + (su ascending). */
int64_t ft_hits_acquire(const int64_t *ready_of, const int64_t *uniq, int64_t nu, const int64_t *flat, int64_t nf,
                        int32_t *locks, uint8_t *prefetched, int64_t *slots, int64_t *su) {
    for (int64_t i = 0; i < nf; i++) {
        const int64_t s = ready_of[flat[i]];
        if (s < 0) return -1;
        slots[i] = s;
    }
    int64_t used = 0, up = 1;
    for (int64_t j = 0; j < nu; j++) {
        const int64_t s = ready_of[uniq[j]];
        su[j] = s;
        locks[s] += 1;
        if (prefetched[s]) { prefetched[s] = 0; used++; }
        if (j && s <= su[j - 1]) up = 0;
    }
    return used * 2 + up;
}

/* Each of su (distinct slots) unlocked once. */
void ft_hits_release(int32_t *locks, const int64_t *su, int64_t n) {
    for (int64_t j = 0; j < n; j++) locks[su[j]] -= 1;
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A layer call's routed ids as the tier keys them: flat[i] = ids[i] + off (n of them), uniq the
 * distinct ones ascending; returns how many (numpy's add, sort and dedup: 3-4 calls in situ). */
int64_t ft_hits_route(const int64_t *ids, int64_t n, int64_t off, int64_t *flat, int64_t *uniq) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t f = ids[i] + off;
        flat[i] = f;
        if (n > 64) { uniq[i] = f; continue; }     /* a prompt chunk's many: qsort below */
        int64_t j = i;                             /* a decode call's few: insertion */
        while (j > 0 && uniq[j - 1] > f) { uniq[j] = uniq[j - 1]; j--; }
        uniq[j] = f;
    }
    if (n > 64) qsort(uniq, (size_t)n, sizeof *uniq, cmp_i64);
    int64_t nu = 0;
    for (int64_t i = 0; i < n; i++)
        if (!nu || uniq[i] != uniq[nu - 1]) uniq[nu++] = uniq[i];
    return nu;
}
