/* The persistent pool of pinned worker threads every parallel kernel runs on, its scratch
 * memory, and the memory-bandwidth probe. */
#include "ft_kernels.h"

typedef struct { ft_pool *p; int tid; int cpu; } worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
static inline int64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void pool_barrier(ft_pool *p) {
    if (p->active == 1) return;
    int g = atomic_load(&p->bar_gen);
    if (atomic_fetch_add(&p->bar_count, 1) == p->n - 1) {
        atomic_store(&p->bar_count, 0);
        atomic_fetch_add(&p->bar_gen, 1);
        return;
    }
    for (unsigned k = 0; atomic_load(&p->bar_gen) == g; k++) {
        if (k < 4096) cpu_relax(); else sched_yield();
    }
}

static void *worker_main(void *a) {
    worker_arg wa = *(worker_arg *)a;
    free(a);
    ft_pool *p = wa.p;
#ifdef __linux__
    if (wa.cpu >= 0) {
        cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(wa.cpu, &cs);
        pthread_setaffinity_np(pthread_self(), sizeof cs, &cs);
    }
#endif
    int seen = 0;
    for (;;) {
        int64_t t0 = 0;
        for (unsigned k = 0; atomic_load(&p->gen) == seen && !atomic_load(&p->stop); k++) {
            /* a few us of pause, then yield: a spinning worker must not hold its core against
             * another runnable thread (torch's OpenMP workers in prefill, other processes) */
            if (k < 2048) cpu_relax(); else sched_yield();
            int parked = atomic_load(&p->park);
            if (parked || (k & 255) == 255) {
                int64_t t = parked ? 0 : now_ns();
                if (!parked && !t0) t0 = t;
                else if (parked || t - t0 > p->spin_ns) {
                    pthread_mutex_lock(&p->mu);
                    atomic_fetch_add(&p->sleepers, 1);
                    while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
                    atomic_fetch_sub(&p->sleepers, 1);
                    pthread_mutex_unlock(&p->mu);
                    t0 = 0;
                }
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->gen);
        p->fn(p->arg, wa.tid);
        atomic_fetch_add(&p->done, 1);
    }
}

/* Jobs under p->small_bytes of weights/keys run on the calling thread alone: handing them to
 * the workers (a wake-up or a spin hand-off, then a join) costs more than the work. */
void pool_run_sized(ft_pool *p, job_fn fn, void *arg, int64_t bytes) {
    if (p->n == 1 || bytes < p->small_bytes) { p->active = 1; fn(arg, 0); return; }
    p->active = p->n;
    p->fn = fn; p->arg = arg;
    atomic_store(&p->park, 0);
    atomic_store(&p->done, 0);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu); pthread_cond_broadcast(&p->cv); pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0);
    for (unsigned k = 0; atomic_load(&p->done) != p->n - 1; k++) {
        if (k < 4096) cpu_relax(); else sched_yield();
    }
}

void pool_run(ft_pool *p, job_fn fn, void *arg) { pool_run_sized(p, fn, arg, INT64_MAX); }

/* cpus: n entries (entry 0, the calling thread, is not pinned); NULL = no pinning.
 * small_bytes: jobs that read fewer bytes run on the calling thread alone. */
void *ft_pool_create(int n, const int *cpus, int64_t spin_ns, int64_t small_bytes) {
    pthread_once(&tables_once, init_tables);
    if (n < 1) n = 1;
    ft_pool *p = calloc(1, sizeof *p);
    p->n = n;
    p->spin_ns = spin_ns;
    p->small_bytes = small_bytes;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->th = calloc((size_t)n, sizeof(pthread_t));
    for (int i = 1; i < n; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        wa->p = p; wa->tid = i; wa->cpu = cpus ? cpus[i] : -1;
        pthread_create(&p->th[i], NULL, worker_main, wa);
    }
    return p;
}

void ft_pool_destroy(void *vp) {
    ft_pool *p = vp;
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu); pthread_cond_broadcast(&p->cv); pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    free(p->th); free(p->scratch); free(p);
}

int ft_pool_size(void *vp) { return ((ft_pool *)vp)->n; }

/* The caller is about to block (the disk tier waiting on a read): the idle workers stop
 * spinning and sleep until the next call, instead of spinning out spin_ns first -- CPU that
 * the readers (and, on a shared box, other programs) would have. */
void ft_pool_park(void *vp) { if (vp) atomic_store(&((ft_pool *)vp)->park, 1); }

/* Workers asleep on the pool's condition now (tests of ft_pool_park). */
int ft_pool_sleeping(void *vp) { return atomic_load(&((ft_pool *)vp)->sleepers); }

uint8_t *scratch(ft_pool *p, size_t bytes) {
    if (bytes > p->scratch_cap) {
        free(p->scratch);
        p->scratch_cap = bytes + bytes / 4 + 4096;
        if (posix_memalign((void **)&p->scratch, 64, p->scratch_cap)) { p->scratch = NULL; p->scratch_cap = 0; }
    }
    return p->scratch;
}

/* ------------------------------------------------------------------ bandwidth probe */

typedef struct { const uint8_t *buf; int64_t n; double *sums; ft_pool *p; } read_job;

static void read_fn(void *a, int tid) {
    read_job *R = a;
    int64_t per = (R->n / R->p->active) & ~(int64_t)255;
    const uint8_t *b = R->buf + per * tid;
    int64_t n = tid == R->p->active - 1 ? R->n - per * tid : per;
    double s = 0;
#ifdef FT_AVX2
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(b + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(b + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(b + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(b + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    s = (double)_mm256_extract_epi64(a0, 0);
#else
    uint64_t acc = 0;
    for (int64_t i = 0; i + 8 <= n; i += 8) { uint64_t v; memcpy(&v, b + i, 8); acc ^= v; }
    s = (double)acc;
#endif
    R->sums[tid] = s;
}

/* Reads n bytes (64-byte aligned buffer) with all pool threads; returns a checksum. */
double ft_read_bytes(void *vp, const void *buf, int64_t n) {
    ft_pool *p = vp;
    double sums[256] = {0};
    read_job R = {buf, n, sums, p};
    pool_run(p, read_fn, &R);
    double s = 0; for (int i = 0; i < p->n && i < 256; i++) s += sums[i];
    return s;
}
