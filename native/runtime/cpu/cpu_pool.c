/* The cpu module's worker threads: each device's pool, and its trace in a measuring build. */
#define _GNU_SOURCE
#include "cpu_module.h"

/* ---- pool trace (a build for measuring: -DEB_POOL_TRACE; bench/pool_trace.py builds and reads it) -------------
 *
 * Every pool run (its kind and weight bytes, when it started, when the driving thread finished its own items, when
 * the last worker finished) and every work item (thread, rows, start and end), in memory, written when the module
 * shuts down to the file named by EXPERTBENCH_POOL_TRACE. In the normal build the trace_* calls are empty. */
#ifdef EB_POOL_TRACE
enum { TRACE_RUNS = 1 << 18, TRACE_ITEMS = 1 << 21 };
typedef struct {
    uint64_t start, driver_done, end, bytes;
    int64_t total;
    int kind;
} trace_run;
typedef struct {
    uint64_t start, end;
    int64_t begin, stop;
    long run;
    int thread;
} trace_item;
static trace_run *trace_runs; /* allocated by cpu_init */
static trace_item *trace_items;
static _Atomic long trace_n_runs, trace_n_items, trace_n_workers;
static _Thread_local int trace_kind; /* set by a pool's driver just before its pool_run */
static _Thread_local uint64_t trace_bytes;
static _Thread_local int trace_thread; /* 0: a driver; workers are numbered from 1 as they start */
static uint64_t trace_clock(void) { return now_ns(); }
void trace_note(int kind, uint64_t bytes) {
    trace_kind = kind;
    trace_bytes = bytes;
}
static void trace_worker_start(void) { trace_thread = (int)atomic_fetch_add(&trace_n_workers, 1) + 1; }
static long trace_run_begin(int64_t total) {
    long k = atomic_fetch_add(&trace_n_runs, 1);
    if (!trace_runs || k >= TRACE_RUNS) return -1;
    trace_runs[k] = (trace_run){.start = now_ns(), .total = total, .kind = trace_kind, .bytes = trace_bytes};
    trace_kind = 0, trace_bytes = 0;
    return k;
}
static void trace_run_end(long run, uint64_t driver_done) {
    if (run >= 0) trace_runs[run].driver_done = driver_done, trace_runs[run].end = now_ns();
}
static void trace_item_done(long run, uint64_t start, int64_t begin, int64_t stop) {
    if (run < 0 || !trace_items) return;
    long k = atomic_fetch_add(&trace_n_items, 1);
    if (k < TRACE_ITEMS) trace_items[k] = (trace_item){start, now_ns(), begin, stop, run, trace_thread};
}
void trace_write(void) {
    const char *path = getenv("EXPERTBENCH_POOL_TRACE");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) {
        long nr = atomic_load(&trace_n_runs), ni = atomic_load(&trace_n_items);
        fprintf(f, "recorded %ld %d %ld %d\n", nr, TRACE_RUNS, ni, TRACE_ITEMS);
        for (long i = 0; i < nr && i < TRACE_RUNS; i++)
            fprintf(f, "run %ld %d %lld %llu %llu %llu %llu\n", i, trace_runs[i].kind, (long long)trace_runs[i].total,
                    (unsigned long long)trace_runs[i].bytes, (unsigned long long)trace_runs[i].start,
                    (unsigned long long)trace_runs[i].driver_done, (unsigned long long)trace_runs[i].end);
        for (long i = 0; i < ni && i < TRACE_ITEMS; i++)
            fprintf(f, "item %ld %d %lld %lld %llu %llu\n", trace_items[i].run, trace_items[i].thread,
                    (long long)trace_items[i].begin, (long long)trace_items[i].stop,
                    (unsigned long long)trace_items[i].start, (unsigned long long)trace_items[i].end);
        fclose(f);
    }
    free(trace_runs), free(trace_items);
    trace_runs = NULL, trace_items = NULL;
}
void trace_alloc(void) { /* one traced runtime at a time: a second one's cpu_init starts a new trace */
    if (!trace_runs) trace_runs = calloc(TRACE_RUNS, sizeof *trace_runs);
    if (!trace_items) trace_items = calloc(TRACE_ITEMS, sizeof *trace_items);
    atomic_store(&trace_n_runs, 0);
    atomic_store(&trace_n_items, 0);
    atomic_store(&trace_n_workers, 0);
}
#else
static inline uint64_t trace_clock(void) { return 0; }
static inline void trace_worker_start(void) {}
static inline long trace_run_begin(int64_t total) { return (void)total, -1; }
static inline void trace_run_end(long run, uint64_t driver_done) { (void)run, (void)driver_done; }
static inline void trace_item_done(long run, uint64_t start, int64_t begin, int64_t stop) {
    (void)run, (void)start, (void)begin, (void)stop;
}
#endif

/* ---- thread pool ------------------------------------------------------------------------------------- */

/* Take work items until none is left. With a share, items shrink as the work runs out (guided scheduling): long
 * ones first, for long weight streams, and short ones last, so the threads finish a product close together. */
static void pool_work(pool *p) {
    for (;;) {
        int64_t b = atomic_load(&p->next), size;
        do {
            if (b >= p->total) return;
            size = p->step;
            if (p->share) {
                int64_t steps = (p->total - b) / p->share / p->step;
                if (steps > 1) size = steps * p->step;
            }
        } while (!atomic_compare_exchange_weak(&p->next, &b, b + size));
        int64_t e = b + size < p->total ? b + size : p->total;
        uint64_t t0 = trace_clock();
        p->fn(p->arg, b, e);
        trace_item_done(p->trace_run, t0, b, e);
    }
}

static void *pool_worker(void *arg) {
    pool *p = ((pool_worker_arg *)arg)->p;
    pool_done *done = &p->done[((pool_worker_arg *)arg)->index];
    uint64_t seen = 0;
    trace_worker_start();
    for (;;) {
        int spins = 0;
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERATIONS) {
                cpu_relax();
                continue;
            }
            if (spins < SPIN_ITERATIONS + YIELD_ITERATIONS) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->generation);
        pool_work(p);
        atomic_store(&done->generation, seen);
        if (atomic_load(&p->driver_waiting)) { /* seq_cst against the driver's store and load: no lost wake-up */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Whether every worker has finished generation gen. */
static int pool_all_done(pool *p, uint64_t gen) {
    for (int w = 0; w < p->n_threads - 1; w++)
        if (atomic_load(&p->done[w].generation) != gen) return 0;
    return 1;
}

/* Run fn over [0, total) on the pool's threads, the caller taking part, in work items of whole steps: of one step
 * each (per_thread = 0), or guided: each item takes 1/(threads x per_thread) of the work left. */
void pool_run(pool *p, pool_fn fn, void *arg, int64_t total, int64_t step, int per_thread) {
    if (total <= 0) return;
    long run = trace_run_begin(total);
    if (p->n_threads <= 1 || total <= step) {
        uint64_t t0 = trace_clock();
        fn(arg, 0, total);
        trace_item_done(run, t0, 0, total);
        trace_run_end(run, trace_clock());
        return;
    }
    p->trace_run = run;
    p->fn = fn;
    p->arg = arg;
    p->total = total;
    p->step = step;
    p->share = (int64_t)p->n_threads * per_thread;
    atomic_store(&p->next, 0);
    pthread_mutex_lock(&p->mu);
    uint64_t gen = atomic_fetch_add(&p->generation, 1) + 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    pool_work(p);
    uint64_t driver_done = trace_clock();
    int spins = 0;
    while (!pool_all_done(p, gen)) {
        if (++spins < SPIN_ITERATIONS) {
            cpu_relax();
            continue;
        }
        if (spins < SPIN_ITERATIONS + YIELD_ITERATIONS) {
            sched_yield();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->driver_waiting, 1);
        while (!pool_all_done(p, gen)) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store(&p->driver_waiting, 0);
        pthread_mutex_unlock(&p->mu);
    }
    trace_run_end(run, driver_done);
}

int pool_init(pool *p, int n_threads) {
    memset(p, 0, sizeof *p);
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (p->n_threads == 1) return 0;
    size_t n = (size_t)p->n_threads - 1;
    p->workers = calloc(n, sizeof *p->workers);
    p->args = calloc(n, sizeof *p->args);
    p->done = aligned_alloc(64, n * sizeof *p->done);
    if (!p->workers || !p->args || !p->done) {
        free(p->workers), free(p->args), free(p->done);
        p->workers = NULL, p->args = NULL, p->done = NULL;
        p->n_threads = 1;
        return EB_ERR_MEMORY;
    }
    for (size_t i = 0; i < n; i++) atomic_init(&p->done[i].generation, 0);
    for (int i = 0; i < p->n_threads - 1; i++) {
        p->args[i] = (pool_worker_arg){p, i};
        if (pthread_create(&p->workers[i], NULL, pool_worker, &p->args[i]) != 0) {
            p->n_threads = i + 1; /* the ones started are joined by pool_destroy */
            return EB_ERR_DEVICE;
        }
    }
    return 0;
}

void pool_destroy(pool *p) {
    if (p->workers) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->workers[i], NULL);
        free(p->workers);
        free(p->args);
        free(p->done);
    }
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
}
