/* The cpu runtime module: devices are groups of worker threads over host memory.
 *
 * Each device owns a thread pool and a queue. Synchronous work (matmul, inline expert batches) is run by the
 * calling thread with the pool's workers; queued work (async copies and expert batches, submitted by the
 * scheduler for an owner that is not the primary) is run by the device's own thread with the same workers,
 * so two devices compute at once. Work is split by output rows and each row is computed entirely by one
 * thread, so results do not depend on the number of threads or on which device ran them.
 *
 * Built twice: as "cpu" (host-addressable devices), and as "hostsim" (-DEB_CPU_HOSTSIM), a CPU-backed runtime
 * whose devices behave like a discrete accelerator (weights uploaded, inputs staged through host arenas), so
 * the unlike-runtime path of the scheduler runs and is tested on a machine with no GPU.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "eb_formats.h"
#include "eb_ops.h"
#include "eb_q8.h"
#include "eb_runtime.h"

#ifdef EB_CPU_HOSTSIM
#define RUNTIME_NAME "hostsim"
#define HOST_ADDRESSABLE 0
#else
#define RUNTIME_NAME "cpu"
#define HOST_ADDRESSABLE 1
#endif

/* Waiting: spin briefly (the next piece of work usually follows within microseconds), then yield the core
 * (so a worker that was descheduled on a busy machine gets it back), then sleep. */
#define SPIN_ITERATIONS 2000
#define YIELD_ITERATIONS 200
#define QUEUE_CAPACITY 16

typedef void (*pool_fn)(void *arg, int64_t begin, int64_t end);

typedef struct {
    int n_threads; /* including the thread that drives it */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    _Atomic uint64_t generation;
    _Atomic int stop;
    struct pool_done *done; /* per worker, its own cache line: the last generation it finished */
    struct pool_worker_arg *args;
    _Atomic int driver_waiting; /* the driver sleeps on cv_done: a worker that finishes signals it */
    _Atomic int64_t next;
    pool_fn fn;
    void *arg;
    int64_t total;
    int64_t step;  /* work items are whole multiples of step */
    int64_t share; /* 0: items of one step; else each item takes 1/share of the work left (at least one step) */
    long trace_run; /* this run's index in the pool trace, or -1 */
} pool;

/* A worker's report that it finished a generation, alone in its cache line: the driver reads them all at once
 * instead of every worker decrementing one shared counter in turn (16 threads took 2-3 us per run doing that). */
typedef struct pool_done {
    _Alignas(64) _Atomic uint64_t generation;
} pool_done;

typedef struct pool_worker_arg {
    pool *p;
    int index;
} pool_worker_arg;

enum { CMD_COPY, CMD_FFN, CMD_EVENT };

/* A completion event: pending until the device's queue reaches it, then the time it did. */
typedef struct {
    _Atomic int pending;
    uint64_t ns;
} cpu_event;

typedef struct {
    int kind;
    void *dst;
    const void *src;
    size_t bytes;
    eb_rt_expert_batch batch; /* experts and pair_start point into the storage below */
    eb_rt_expert *experts;
    int32_t *pair_start;
    int32_t capacity; /* experts storage, grown on demand and kept */
    cpu_event *event; /* CMD_EVENT */
} command;

struct cpu_runtime;

typedef struct {
    struct cpu_runtime *rt;
    int index;
    pool pool;
    pthread_mutex_t run_lock; /* one driver of the pool at a time */
    /* the queue */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t qmu;
    pthread_cond_t q_nonempty, q_idle;
    command queue[QUEUE_CAPACITY];
    int head, count, busy, stop;
    int error;
    char error_text[256];
    _Atomic uint64_t busy_ns;
    _Atomic uint64_t allocated;
    void *_Atomic recording; /* hostsim: the graph being recorded, or NULL */
    /* the forward operations' scratch (under run_lock), grown on demand and kept: once warm, no allocation */
    void *scratch;
    size_t scratch_cap;
    /* activations quantized for the q8 precision (under run_lock), grown on demand and kept */
    void *act;
    size_t act_cap;
    /* a queued expert batch that could not run (out of memory): reported, and cleared, by the next wait */
    _Atomic int failed;
} cpu_device;

typedef struct cpu_runtime {
    int n_devices;
    cpu_device *devices;
    eb_cpu_kernel_set kernels; /* the best set the CPU runs, each NULL entry filled from the sets below it */
    int avx2;                  /* the AVX2 sets (attention's AVX2 copy) */
    char cpu_name[EB_MAX_NAME];
    uint64_t memory_limit;
    /* A product's work items each take 1/(threads x per_thread) of the rows left, down to one step (guided
     * scheduling). Tunable with EXPERTBENCH_CHUNKS_PER_THREAD (1..64) for measuring; see bench/RESULTS.md. */
    int per_thread;
} cpu_runtime;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- pool trace (a build for measuring: -DEB_POOL_TRACE; bench/pool_trace.py builds and reads it) -------------
 *
 * Every pool run (its kind and weight bytes, when it started, when the driving thread finished its own items, when
 * the last worker finished) and every work item (thread, rows, start and end), in memory, written when the module
 * shuts down to the file named by EXPERTBENCH_POOL_TRACE. In the normal build the trace_* calls are empty. */
enum { TRACE_PARALLEL_FOR = 1, TRACE_MATMUL, TRACE_MULTI, TRACE_GATE_UP }; /* the kinds of pool run */
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
static void trace_note(int kind, uint64_t bytes) {
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
static void trace_write(void) {
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
static void trace_alloc(void) { /* one traced runtime at a time: a second one's cpu_init starts a new trace */
    if (!trace_runs) trace_runs = calloc(TRACE_RUNS, sizeof *trace_runs);
    if (!trace_items) trace_items = calloc(TRACE_ITEMS, sizeof *trace_items);
    atomic_store(&trace_n_runs, 0);
    atomic_store(&trace_n_items, 0);
    atomic_store(&trace_n_workers, 0);
}
#else
static inline uint64_t trace_clock(void) { return 0; }
static inline void trace_note(int kind, uint64_t bytes) { (void)kind, (void)bytes; }
static inline void trace_worker_start(void) {}
static inline long trace_run_begin(int64_t total) { return (void)total, -1; }
static inline void trace_run_end(long run, uint64_t driver_done) { (void)run, (void)driver_done; }
static inline void trace_item_done(long run, uint64_t start, int64_t begin, int64_t stop) {
    (void)run, (void)start, (void)begin, (void)stop;
}
static inline void trace_write(void) {}
static inline void trace_alloc(void) {}
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
static void pool_run(pool *p, pool_fn fn, void *arg, int64_t total, int64_t step, int per_thread) {
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

static int pool_init(pool *p, int n_threads) {
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

static void pool_destroy(pool *p) {
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

/* ---- kernels ----------------------------------------------------------------------------------------- */

/* The smallest work item of a product: whole 8-row tiles and at least 32 KiB of weights. A work item's weight
 * streams start cold: in the VM's fast memory state items of 16-32 KiB streamed at 14 GB/s a thread, against 35-38
 * for long ones, and decode was 1.9 % faster with 32 KiB than with 16 (bench/RESULTS.md). */
static int64_t step_rows(int64_t cols, int dtype) {
    int64_t rowbytes = (int64_t)eb_row_bytes(dtype, cols), rows = (32768 + rowbytes - 1) / rowbytes;
    return (rows + 7) / 8 * 8;
}

/* Several products as one pool run over their concatenated rows. */
#define MAX_TASKS 64

/* The q8 precision applies where the format has integer products (its q8_block, EB_FORMATS); the others (the float
 * formats, Q5_0 / Q5_1) are read with f32 activations in either precision. */
static int uses_q8(const cpu_runtime *rt, int precision, int dtype) {
    return precision == EB_PRECISION_Q8 && rt->kernels.format[dtype].q8 != NULL;
}

/* Debug builds (sanitizers, or -DEB_CPU_CHECK_WRITES=1) check that a product writes every output it owns: each is
 * first set to a NaN no kernel computes and looked for after, so a format or precision routed to a kernel that leaves
 * outputs unwritten (stale memory: another result on every run) stops the process at that product. */
#ifndef EB_CPU_CHECK_WRITES
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EB_CPU_CHECK_WRITES 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EB_CPU_CHECK_WRITES 1
#endif
#endif
#endif
#if EB_CPU_CHECK_WRITES
#define UNWRITTEN 0x7fc0dead
static void mark_unwritten(float *y, int64_t r0, int64_t r1, int64_t n, int64_t ldy) {
    uint32_t bits = UNWRITTEN;
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = r0; r < r1; r++) memcpy(&y[t * ldy + r], &bits, sizeof bits);
}
static void check_written(const float *y, int dtype, int q8, int64_t r0, int64_t r1, int64_t n, int64_t ldy) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = r0; r < r1; r++) {
            uint32_t bits;
            memcpy(&bits, &y[t * ldy + r], sizeof bits);
            if (bits != UNWRITTEN) continue;
            fprintf(stderr, RUNTIME_NAME " runtime: a %s product (%s activations) left row %lld of token %lld "
                            "unwritten\n",
                    eb_dtype_name(dtype), q8 ? "q8" : "f32", (long long)r, (long long)t);
            abort();
        }
}
#endif

/* Rows [r0, r1) of w times n tokens into y (token t's row r at y[t * ldy + r]): the format's integer products where
 * its activations were quantized for them (xq), else its f32 ones. The one place a product picks its kernel. */
static void product(const eb_cpu_kernel_set *k, const void *w, int dtype, const float *scale, int64_t r0, int64_t r1,
                    int64_t cols, const float *x, const eb_cpu_q8_rows *xq, int64_t n, float *y, int64_t ldy) {
    const eb_cpu_format_kernels *f = &k->format[dtype];
    int q8 = xq && xq->q && f->q8;
#if EB_CPU_CHECK_WRITES
    mark_unwritten(y, r0, r1, n, ldy);
#endif
    if (q8) f->q8(w, dtype, r0, r1, cols, xq, n, y, ldy);
    else f->rows(w, dtype, scale, r0, r1, cols, x, n, y, ldy);
#if EB_CPU_CHECK_WRITES
    check_written(y, dtype, q8, r0, r1, n, ldy);
#endif
}

/* A device buffer of at least bytes, grown by half again on demand and kept: no allocation once warm. */
static void *grown(void **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        size_t want = (bytes + bytes / 2 + 63) / 64 * 64;
        void *p = aligned_alloc(64, want);
        if (!p) return NULL;
        free(*buf);
        *buf = p;
        *cap = want;
    }
    return *buf;
}

/* The device's buffer of quantized activations (q8 precision). */
static void *act_buffer(cpu_device *d, size_t bytes) { return grown(&d->act, &d->act_cap, bytes); }

typedef struct {
    const eb_cpu_kernel_set *k;
    const eb_rt_matmul *tasks;
    int n_tasks;
    int64_t start[MAX_TASKS + 1];
    eb_cpu_q8_rows xq[MAX_TASKS]; /* a task's quantized activations (q NULL: it reads x in f32) */
} multi_job;

static void multi_chunk(void *arg, int64_t begin, int64_t end) {
    const multi_job *j = (const multi_job *)arg;
    for (int i = 0; i < j->n_tasks; i++) {
        int64_t lo = begin > j->start[i] ? begin : j->start[i], hi = end < j->start[i + 1] ? end : j->start[i + 1];
        if (lo >= hi) continue;
        const eb_rt_matmul *t = &j->tasks[i];
        product(j->k, t->w, t->dtype, t->scale.data, lo - j->start[i], hi - j->start[i], t->cols, t->x, &j->xq[i], t->n,
                t->y, t->rows);
    }
}

/* Quantize the activations of the job's q8 tasks, once per distinct input (q, k and v read the same rows). Without
 * memory for them the tasks read x in f32 instead: slower is not wrong, but it is another result, so it is an
 * error. */
static int quantize_tasks(cpu_device *d, multi_job *job) {
    const cpu_runtime *rt = d->rt;
    size_t bytes = 0;
    for (int i = 0; i < job->n_tasks; i++)
        if (uses_q8(rt, job->tasks[i].precision, job->tasks[i].dtype))
            bytes += eb_cpu_q8_bytes(job->tasks[i].n, job->tasks[i].cols, eb_format(job->tasks[i].dtype)->q8_block);
    if (!bytes) return 0;
    unsigned char *mem = act_buffer(d, bytes);
    if (!mem) return EB_ERR_MEMORY;
    for (int i = 0; i < job->n_tasks; i++) {
        const eb_rt_matmul *t = &job->tasks[i];
        if (!uses_q8(rt, t->precision, t->dtype)) continue;
        int same = -1, block = eb_format(t->dtype)->q8_block;
        for (int k = 0; k < i && same < 0; k++)
            if (job->xq[k].q && job->tasks[k].x == t->x && job->tasks[k].n == t->n && job->tasks[k].cols == t->cols &&
                job->xq[k].block == block)
                same = k;
        if (same >= 0) {
            job->xq[i] = job->xq[same];
            continue;
        }
        job->xq[i] = eb_cpu_q8_layout(mem, t->n, t->cols, block);
        rt->kernels.quantize_q8(t->x, t->n, t->cols, &job->xq[i]);
        mem += eb_cpu_q8_bytes(t->n, t->cols, block);
    }
    return 0;
}

static int run_multi(cpu_runtime *rt, cpu_device *d, const eb_rt_matmul *tasks, int n_tasks) {
    for (int first = 0; first < n_tasks; first += MAX_TASKS) {
        multi_job job = {.k = &rt->kernels, .tasks = tasks + first};
        job.n_tasks = n_tasks - first < MAX_TASKS ? n_tasks - first : MAX_TASKS;
        int st = quantize_tasks(d, &job);
        if (st) return st;
        job.start[0] = 0;
        for (int i = 0; i < job.n_tasks; i++) job.start[i + 1] = job.start[i] + job.tasks[i].rows;
        int64_t total = job.start[job.n_tasks], step = 8;
        uint64_t bytes = 0;
        for (int i = 0; i < job.n_tasks; i++) {
            int64_t s = step_rows(job.tasks[i].cols, job.tasks[i].dtype);
            if (s > step) step = s;
            bytes += (uint64_t)job.tasks[i].rows * eb_row_bytes(job.tasks[i].dtype, job.tasks[i].cols);
        }
        trace_note(job.n_tasks == 1 ? TRACE_MATMUL : TRACE_MULTI, bytes);
        pool_run(&d->pool, multi_chunk, &job, total, step, rt->per_thread);
    }
    return 0;
}

/* The gate and up products of several experts as one pool run over their rows: a work item computes rows [r0, r1)
 * of an expert's gate and of its up product, then g = silu(g) * u for them, so that the down products can start
 * at once (no pass over g by the calling thread alone between the two runs). */
typedef struct {
    const eb_cpu_kernel_set *k;
    const eb_cpu_q8_rows *xq; /* the gathered rows quantized (q8 precision) in blocks of 32 and 256, or NULL */
    const eb_rt_expert_batch *b;
    int32_t expert[MAX_TASKS];     /* indices into b->experts, those with pairs */
    int64_t start[MAX_TASKS + 1]; /* each contributes inter rows */
    int n;
    const float *xe;
    float *g, *u;
} gate_up_job;

static void gate_up_chunk(void *arg, int64_t begin, int64_t end) {
    const gate_up_job *j = (const gate_up_job *)arg;
    int64_t H = j->b->hidden, I = j->b->inter;
    for (int i = 0; i < j->n; i++) {
        int64_t lo = begin > j->start[i] ? begin : j->start[i], hi = end < j->start[i + 1] ? end : j->start[i + 1];
        if (lo >= hi) continue;
        int64_t r0 = lo - j->start[i], r1 = hi - j->start[i];
        const eb_rt_expert *e = &j->b->experts[j->expert[i]];
        int64_t p0 = j->b->pair_start[j->expert[i]], m = j->b->pair_start[j->expert[i] + 1] - p0;
        float *g = j->g + p0 * I, *u = j->u + p0 * I;
        const void *w[2] = {e->gate, e->up};
        const float *sc[2] = {e->gate_scale.data, e->up_scale.data};
        int dt[2] = {e->gate_dtype, e->up_dtype};
        float *out[2] = {g, u};
        /* gate and up may differ in format (llama.cpp's quantizer writes Q5_0 beside Q8_0 or MXFP4): each takes its
         * own block's activations, or f32 ones where it has no integer products */
        for (int k = 0; k < 2; k++) {
            int block = eb_format(dt[k])->q8_block;
            const eb_cpu_q8_rows *a = j->xq && block ? &j->xq[block == 256] : NULL;
            eb_cpu_q8_rows x = {0};
            if (a && a->q)
                x = (eb_cpu_q8_rows){a->q + p0 * H, a->d + p0 * H / a->block, a->s16 + p0 * H / 16, H, a->block};
            product(j->k, w[k], dt[k], sc[k], r0, r1, H, j->xe + p0 * H, &x, m, out[k], I);
        }
        const eb_rt_act *act = &j->b->act;
        /* both products q8 ones: the q8 precision's activation (eb_q8.h), which the GPU modules compute alike */
        int q8 = j->b->precision == EB_PRECISION_Q8 && j->k->format[dt[0]].q8 && j->k->format[dt[1]].q8;
        for (int64_t p = 0; p < m; p++) {
            float *gp = g + p * I, *up = u + p * I;
            if (e->bias)
                for (int64_t r = r0; r < r1; r++) gp[r] += e->bias[r], up[r] += e->bias[I + r];
            if (q8)
                for (int64_t r = r0; r < r1; r++) gp[r] = eb_q8_act(act->kind, act->alpha, act->limit, gp[r], up[r]);
            else
                for (int64_t r = r0; r < r1; r++) gp[r] = eb_act(act->kind, act->alpha, act->limit, gp[r], up[r]);
        }
    }
}

/* The same arithmetic as the core's single-device path: every expert's products over its gathered rows. Per 64
 * experts, one pool run computes the gate and up products and silu(g) * u (gate_up_chunk), then another the down
 * products. */
/* The gathered rows in both block sizes of the q8 precision (32: Q8_0, MXFP4; 256: the K formats) that H is a whole
 * number of. */
static int quantize_gathered(cpu_device *d, const float *xe, int64_t n, int64_t H, eb_cpu_q8_rows *xq) {
    size_t small = H % 32 ? 0 : eb_cpu_q8_bytes(n, H, 32), big = H % 256 ? 0 : eb_cpu_q8_bytes(n, H, 256);
    unsigned char *mem = act_buffer(d, small + big);
    if (!mem) return EB_ERR_MEMORY;
    if (small) {
        xq[0] = eb_cpu_q8_layout(mem, n, H, 32);
        d->rt->kernels.quantize_q8(xe, n, H, &xq[0]);
    }
    if (big) {
        xq[1] = eb_cpu_q8_layout(mem + small, n, H, 256);
        d->rt->kernels.quantize_q8(xe, n, H, &xq[1]);
    }
    return 0;
}

static int run_expert_batch(cpu_runtime *rt, cpu_device *d, const eb_rt_expert_batch *b) {
    int64_t H = b->hidden, I = b->inter;
    float *xe = (float *)b->scratch;
    float *g = xe + (size_t)b->n_pairs * (size_t)H;
    float *u = g + (size_t)b->n_pairs * (size_t)I;
    float *yp = u + (size_t)b->n_pairs * (size_t)I;
    int owner_local = b->mode == EB_REDUCE_OWNER_LOCAL;
    float *down_out = owner_local ? yp : b->y;
    for (int64_t p = 0; p < b->n_pairs; p++)
        memcpy(xe + p * H, b->x + (int64_t)b->pair_token[p] * H, (size_t)H * sizeof(float));
    /* q8: the gathered rows quantized once for every expert's gate and up (blocks of 32 and of 256: [0] and [1]) */
    eb_cpu_q8_rows xq[2] = {{0}, {0}};
    int quantize = 0;
    for (int32_t i = 0; i < b->n_experts; i++) {
        int g = b->experts[i].gate_dtype, u = b->experts[i].up_dtype;
        quantize |= uses_q8(rt, b->precision, g) || uses_q8(rt, b->precision, u);
    }
    if (quantize && quantize_gathered(d, xe, b->n_pairs, H, xq)) return EB_ERR_MEMORY;
    eb_rt_matmul tasks[MAX_TASKS];
    for (int32_t first = 0; first < b->n_experts; first += MAX_TASKS) {
        int32_t last = first + MAX_TASKS < b->n_experts ? first + MAX_TASKS : b->n_experts;
        gate_up_job job = {.k = &rt->kernels, .xq = quantize ? xq : NULL, .b = b, .xe = xe, .g = g, .u = u};
        int64_t step = 8;
        uint64_t bytes = 0;
        for (int32_t i = first; i < last; i++) {
            if (b->pair_start[i + 1] <= b->pair_start[i]) continue;
            job.expert[job.n] = i;
            job.start[job.n + 1] = job.start[job.n] + I;
            job.n++;
            int64_t s = step_rows(H, b->experts[i].gate_dtype);
            if (s > step) step = s;
            bytes += (uint64_t)I * (eb_row_bytes(b->experts[i].gate_dtype, H) + eb_row_bytes(b->experts[i].up_dtype, H));
        }
        trace_note(TRACE_GATE_UP, bytes);
        pool_run(&d->pool, gate_up_chunk, &job, job.start[job.n], step, rt->per_thread);
        int n = 0;
        for (int32_t i = first; i < last; i++) {
            int64_t p0 = b->pair_start[i], m = b->pair_start[i + 1] - p0;
            const eb_rt_expert *e = &b->experts[i];
            if (m <= 0) continue;
            tasks[n++] = (eb_rt_matmul){e->down, e->down_dtype,  H,           I, g + p0 * I, m, down_out + p0 * H,
                                        b->precision, e->down_scale};
        }
        int st = run_multi(rt, d, tasks, n);
        if (st) return st;
        for (int32_t i = first; i < last; i++) { /* the down products' biases */
            const float *bias = b->experts[i].bias;
            if (!bias) continue;
            for (int64_t p = b->pair_start[i]; p < b->pair_start[i + 1]; p++)
                for (int64_t c = 0; c < H; c++) down_out[p * H + c] += bias[2 * I + c];
        }
        /* the down products reused the buffer: again for the next experts */
        if (quantize && first + MAX_TASKS < b->n_experts && quantize_gathered(d, xe, b->n_pairs, H, xq))
            return EB_ERR_MEMORY;
    }
    if (owner_local) {
        memset(b->y, 0, (size_t)b->n_tokens * (size_t)H * sizeof(float));
        for (int64_t p = 0; p < b->n_pairs; p++) { /* pairs are in ascending expert order */
            float *o = b->y + (int64_t)b->pair_token[p] * H;
            float w = b->pair_weight[p];
            for (int64_t j = 0; j < H; j++) o[j] += yp[p * H + j] * w;
        }
    }
    return 0;
}

/* ---- the device queue -------------------------------------------------------------------------------- */

static void execute(cpu_device *d, command *c) {
    if (c->kind == CMD_EVENT) { /* cleared before the queue's q_idle broadcast, which its waiters sleep on */
        c->event->ns = now_ns();
        atomic_store(&c->event->pending, 0);
        return;
    }
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&d->run_lock);
    if (c->kind == CMD_COPY) {
        if (c->bytes) memcpy(c->dst, c->src, c->bytes);
    } else if (run_expert_batch(d->rt, d, &c->batch)) {
        atomic_store(&d->failed, EB_ERR_MEMORY);
    }
    pthread_mutex_unlock(&d->run_lock);
    atomic_fetch_add(&d->busy_ns, now_ns() - t0);
}

static void *device_thread(void *arg) {
    cpu_device *d = (cpu_device *)arg;
    pthread_mutex_lock(&d->qmu);
    for (;;) {
        while (d->count == 0 && !d->stop) pthread_cond_wait(&d->q_nonempty, &d->qmu);
        if (d->count == 0 && d->stop) break;
        command *c = &d->queue[d->head];
        d->busy = 1;
        pthread_mutex_unlock(&d->qmu);
        execute(d, c);
        pthread_mutex_lock(&d->qmu);
        d->busy = 0;
        d->head = (d->head + 1) % QUEUE_CAPACITY;
        d->count--;
        pthread_cond_broadcast(&d->q_idle);
    }
    pthread_mutex_unlock(&d->qmu);
    return NULL;
}

/* Reserve the next queue slot (waits while the queue is full); returns it with qmu held. */
static command *queue_slot(cpu_device *d) {
    pthread_mutex_lock(&d->qmu);
    while (d->count == QUEUE_CAPACITY) pthread_cond_wait(&d->q_idle, &d->qmu);
    return &d->queue[(d->head + d->count) % QUEUE_CAPACITY];
}

static void queue_push(cpu_device *d) {
    d->count++;
    pthread_cond_signal(&d->q_nonempty);
    pthread_mutex_unlock(&d->qmu);
}

/* ---- the table's functions --------------------------------------------------------------------------- */


static int available_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int numa_nodes(void) {
    DIR *dir = opendir("/sys/devices/system/node");
    if (!dir) return 1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        if (strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9') n++;
    closedir(dir);
    return n > 0 ? n : 1;
}

static void read_cpu_name(char *out, size_t len) {
    snprintf(out, len, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *colon = strchr(line, ':');
            if (colon) {
                colon++;
                while (*colon == ' ') colon++;
                colon[strcspn(colon, "\n")] = 0;
                snprintf(out, len, "%.40s", colon);
            }
            break;
        }
    }
    fclose(f);
}

/* A number from a one-line file (a cgroup's limit or usage); 0 when absent or "max". */
static uint64_t read_number(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "r");
    if (!fp) return 0;
    unsigned long long v = 0;
    if (fscanf(fp, "%llu", &v) != 1) v = 0;
    fclose(fp);
    return (uint64_t)v;
}

/* Room left under this process's cgroup memory limit (v2 memory.max, or v1 memory.limit_in_bytes), counting its
 * usage as taken (page cache included, so this errs low); 0 where there is no limit or it cannot be read. */
static uint64_t cgroup_room(void) {
    FILE *fp = fopen("/proc/self/cgroup", "r");
    if (!fp) return 0;
    char line[1024], dir[1100];
    uint64_t room = 0;
    while (!room && fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = 0;
        char *first = strchr(line, ':'), *second = first ? strchr(first + 1, ':') : NULL;
        if (!second) continue;
        *second = 0;
        const char *controllers = first + 1, *path = second + 1;
        uint64_t limit = 0, used = 0;
        if (*controllers == 0) { /* v2: unified at /sys/fs/cgroup, or /sys/fs/cgroup/unified beside v1 */
            snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", path);
            if (!(limit = read_number(dir, "memory.max"))) {
                snprintf(dir, sizeof dir, "/sys/fs/cgroup/unified%s", path);
                limit = read_number(dir, "memory.max");
            }
            used = read_number(dir, "memory.current");
        } else if (strstr(controllers, "memory")) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", path);
            limit = read_number(dir, "memory.limit_in_bytes");
            used = read_number(dir, "memory.usage_in_bytes");
        }
        if (limit && limit < ((uint64_t)1 << 60)) room = limit > used ? limit - used : 1;
    }
    fclose(fp);
    return room;
}

/* What this process may still take: MemAvailable of /proc/meminfo, or less where a cgroup limit leaves less (a
 * container); 0 where neither can be read. */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
        fclose(f);
    }
    uint64_t avail = (uint64_t)kb * 1024u, room = cgroup_room();
    return room && (!avail || room < avail) ? room : avail;
}

static void cpu_shutdown(void *rtp) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    if (!rt) return;
    for (int i = 0; i < rt->n_devices; i++) {
        cpu_device *d = &rt->devices[i];
        if (d->thread_started) {
            pthread_mutex_lock(&d->qmu);
            d->stop = 1;
            pthread_cond_broadcast(&d->q_nonempty);
            pthread_mutex_unlock(&d->qmu);
            pthread_join(d->thread, NULL);
        }
        for (int k = 0; k < QUEUE_CAPACITY; k++) {
            free(d->queue[k].experts);
            free(d->queue[k].pair_start);
        }
        pool_destroy(&d->pool);
        free(d->scratch);
        free(d->act);
        pthread_mutex_destroy(&d->run_lock);
        pthread_mutex_destroy(&d->qmu);
        pthread_cond_destroy(&d->q_nonempty);
        pthread_cond_destroy(&d->q_idle);
    }
    free(rt->devices);
    free(rt);
    trace_write();
}

/* Set k's entries to those of the set above it where that has them. */
static void over(eb_cpu_kernel_set *k, const eb_cpu_kernel_set *above) {
    if (above->variant) k->variant = above->variant;
    if (above->quantize_q8) k->quantize_q8 = above->quantize_q8;
    for (int dt = 0; dt < EB_DTYPE_COUNT; dt++) {
        const eb_cpu_format_kernels *a = &above->format[dt];
        eb_cpu_format_kernels *f = &k->format[dt];
        if (a->dequantize) f->dequantize = a->dequantize;
        if (a->rows) f->rows = a->rows;
        if (a->q8) f->q8 = a->q8;
    }
}

static int cpu_init(const eb_runtime_options *opt, void **out, char *err, size_t errlen) {
    *out = NULL;
    cpu_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    trace_alloc();
    int cores = available_cores();
    int n_dev = opt && opt->n_devices > 0 ? opt->n_devices : numa_nodes();
    if (n_dev > 64) {
        free(rt);
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: n_devices = %d, expected 1..64", n_dev);
    }
    if (opt && opt->threads_per_device > 1024) {
        free(rt);
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: threads_per_device = %d, expected 0..1024",
                    opt->threads_per_device);
    }
    int threads = opt && opt->threads_per_device > 0 ? opt->threads_per_device : cores / n_dev;
    if (threads < 1) threads = 1;
    rt->memory_limit = opt ? opt->memory_limit : 0;
    rt->per_thread = 1; /* bench/RESULTS.md: products through the module at 95-96 % of a plain read, 86-92 % with 2 */
    const char *cpt = getenv("EXPERTBENCH_CHUNKS_PER_THREAD");
    if (cpt && atoi(cpt) >= 1 && atoi(cpt) <= 64) rt->per_thread = atoi(cpt);
    int kernels = opt ? opt->kernels : EB_CPU_KERNELS_BEST;
    if (kernels < 0 || kernels >= EB_CPU_KERNELS_COUNT) {
        free(rt);
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT,
                          RUNTIME_NAME " runtime: kernels = %d, expected 0 (best), 1 (portable) or 2 (avx2)", kernels);
    }
    rt->kernels = eb_cpu_kernels_portable;
#ifdef EB_CPU_HAVE_AVX2_BUILD
    __builtin_cpu_init();
    if (kernels != EB_CPU_KERNELS_PORTABLE && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        over(&rt->kernels, &eb_cpu_kernels_avx2);
        rt->avx2 = 1;
        /* the q8 products in AVX-512 VNNI (the same bits); the float products keep AVX2's 8-lane order */
        if (kernels == EB_CPU_KERNELS_BEST && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            over(&rt->kernels, &eb_cpu_kernels_avx512);
    }
#endif
    for (int dt = 0; dt < EB_DTYPE_COUNT; dt++) {
        const eb_cpu_format_kernels *f = &rt->kernels.format[dt];
        /* every set has integer products for exactly the formats whose q8_block says so: the q8 precision's result
         * then never depends on the instruction set beyond the sums' order */
        if ((f->q8 != NULL) != (eb_format_table[dt].q8_block != 0) || (f->q8 && !f->rows)) {
            const char *variant = rt->kernels.variant; /* a string constant of the set */
            free(rt);
            return eb_rt_fail(err, errlen, EB_ERR_MODULE,
                              RUNTIME_NAME " runtime: the %s kernels' %s integer products disagree with its q8 "
                                           "block %d",
                              variant, eb_dtype_name(dt), eb_format_table[dt].q8_block);
        }
    }
    read_cpu_name(rt->cpu_name, sizeof rt->cpu_name);
    rt->devices = calloc((size_t)n_dev, sizeof *rt->devices);
    if (!rt->devices) {
        free(rt);
        return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    }
    for (int i = 0; i < n_dev; i++) {
        cpu_device *d = &rt->devices[i];
        d->rt = rt;
        d->index = i;
        pthread_mutex_init(&d->run_lock, NULL);
        pthread_mutex_init(&d->qmu, NULL);
        pthread_cond_init(&d->q_nonempty, NULL);
        pthread_cond_init(&d->q_idle, NULL);
        rt->n_devices = i + 1;
        if (pool_init(&d->pool, threads) != 0 || pthread_create(&d->thread, NULL, device_thread, d) != 0) {
            cpu_shutdown(rt);
            return eb_rt_fail(err, errlen, EB_ERR_DEVICE, RUNTIME_NAME " runtime: could not start worker threads");
        }
        d->thread_started = 1;
    }
    *out = rt;
    return 0;
}

static const char *cpu_kernel_variant(void *rtp) { return ((cpu_runtime *)rtp)->kernels.variant; }

static int cpu_device_count(void *rtp) { return ((cpu_runtime *)rtp)->n_devices; }

static cpu_device *get_dev(cpu_runtime *rt, int dev, char *err, size_t errlen) {
    if (dev < 0 || dev >= rt->n_devices) {
        eb_rt_fail(err, errlen, EB_ERR_RANGE, RUNTIME_NAME " runtime: no device %d (it has %d)", dev, rt->n_devices);
        return NULL;
    }
    return &rt->devices[dev];
}

static uint64_t device_total(cpu_runtime *rt) {
    struct sysinfo si;
    uint64_t total = sysinfo(&si) == 0 ? (uint64_t)si.totalram * si.mem_unit : 0;
    return rt->memory_limit && rt->memory_limit < total ? rt->memory_limit : total;
}

static int cpu_device_info(void *rtp, int dev, eb_rt_device_info *info, char *err, size_t errlen) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    cpu_device *d = get_dev(rt, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%.40s", rt->cpu_name);
    snprintf(info->kind, sizeof info->kind, "%s", HOST_ADDRESSABLE ? "cpu" : "sim");
    info->memory_total = device_total(rt);
    uint64_t avail = mem_available();
    if (rt->memory_limit) {
        uint64_t used = atomic_load(&d->allocated);
        uint64_t left = used < rt->memory_limit ? rt->memory_limit - used : 0;
        avail = left < avail ? left : avail;
    }
    info->memory_free = avail;
    info->threads = d->pool.n_threads;
    info->host_addressable = HOST_ADDRESSABLE;
    info->formats = 0; /* the formats its kernels read */
    for (int dt = 0; dt < EB_DTYPE_COUNT; dt++)
        if (rt->kernels.format[dt].dequantize && rt->kernels.format[dt].rows) info->formats |= 1u << dt;
    info->precisions = 1u << EB_PRECISION_F32 | 1u << EB_PRECISION_Q8;
    return 0;
}

/* Each allocation carries its size in a 64-byte header, for the memory limit's accounting. */
static int cpu_mem_alloc(void *rtp, int dev, size_t bytes, void **ptr, char *err, size_t errlen) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    cpu_device *d = get_dev(rt, dev, err, errlen);
    *ptr = NULL;
    if (!d) return EB_ERR_RANGE;
    if (bytes > SIZE_MAX - 256)
        return eb_rt_fail(err, errlen, EB_ERR_MEMORY, "%s:%d: cannot allocate %zu bytes", RUNTIME_NAME, dev, bytes);
    /* reserve against the limit first (compare-and-swap: two allocating threads cannot both pass) */
    uint64_t used = atomic_load(&d->allocated);
    do {
        if (rt->memory_limit && (bytes > rt->memory_limit || used > rt->memory_limit - bytes))
            return eb_rt_fail(err, errlen, EB_ERR_MEMORY, "%s:%d: cannot allocate %zu bytes: %llu of %llu in use",
                        RUNTIME_NAME, dev, bytes, (unsigned long long)used, (unsigned long long)rt->memory_limit);
    } while (!atomic_compare_exchange_weak(&d->allocated, &used, used + bytes));
    size_t rounded = (bytes + 63) / 64 * 64 + 64;
    unsigned char *p = aligned_alloc(64, rounded);
    if (!p) {
        atomic_fetch_sub(&d->allocated, bytes);
        return eb_rt_fail(err, errlen, EB_ERR_MEMORY, "%s:%d: could not allocate %zu bytes", RUNTIME_NAME, dev, bytes);
    }
    memcpy(p, &bytes, sizeof bytes);
    *ptr = p + 64;
    return 0;
}

static void cpu_mem_free(void *rtp, int dev, void *ptr) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    if (!ptr || dev < 0 || dev >= rt->n_devices) return;
    unsigned char *p = (unsigned char *)ptr - 64;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    atomic_fetch_sub(&rt->devices[dev].allocated, bytes);
    free(p);
}

static int cpu_host_alloc(void *rtp, size_t bytes, void **ptr, char *err, size_t errlen) {
    (void)rtp;
    *ptr = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    return *ptr ? 0 : eb_rt_fail(err, errlen, EB_ERR_MEMORY, "could not allocate %zu bytes of host memory", bytes);
}

static void cpu_host_free(void *rtp, void *ptr) {
    (void)rtp;
    free(ptr);
}

static int cpu_copy(void *rtp, int dev, void *dst, const void *src, size_t bytes, int async, char *err,
                    size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    if (!async) {
        /* in order with queued work */
        pthread_mutex_lock(&d->qmu);
        while (d->count > 0) pthread_cond_wait(&d->q_idle, &d->qmu);
        pthread_mutex_unlock(&d->qmu);
        if (bytes) memcpy(dst, src, bytes);
        return 0;
    }
    command *c = queue_slot(d);
    c->kind = CMD_COPY;
    c->dst = dst;
    c->src = src;
    c->bytes = bytes;
    queue_push(d);
    return 0;
}

/* The failure of a queued expert batch since the last wait, once. */
static int queued_failure(cpu_device *d, char *err, size_t errlen) {
    int st = atomic_exchange(&d->failed, 0);
    if (!st) return 0;
    return eb_rt_fail(err, errlen, st, RUNTIME_NAME " runtime: device %d: out of memory for the quantized activations "
                      "of an expert batch (it did not run)", d->index);
}

static int cpu_synchronize(void *rtp, int dev, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    /* spin briefly: a join usually follows the work it waits for by microseconds */
    for (int spins = 0; spins < SPIN_ITERATIONS; spins++) {
        pthread_mutex_lock(&d->qmu);
        int idle = d->count == 0;
        pthread_mutex_unlock(&d->qmu);
        if (idle) return queued_failure(d, err, errlen);
        cpu_relax();
    }
    pthread_mutex_lock(&d->qmu);
    while (d->count > 0) pthread_cond_wait(&d->q_idle, &d->qmu);
    pthread_mutex_unlock(&d->qmu);
    return queued_failure(d, err, errlen);
}

static int cpu_expert_ffn(void *rtp, int dev, const eb_rt_expert_batch *b, int async, char *err, size_t errlen) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    cpu_device *d = get_dev(rt, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    if (b->scratch_bytes < eb_rt_expert_scratch_bytes(b->n_pairs, b->hidden, b->inter))
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: expert scratch of %zu bytes is too small",
                    b->scratch_bytes);
    if (!async) {
        pthread_mutex_lock(&d->qmu);
        while (d->count > 0) pthread_cond_wait(&d->q_idle, &d->qmu);
        pthread_mutex_unlock(&d->qmu);
        command c = {.kind = CMD_FFN, .batch = *b};
        execute(d, &c);
        return queued_failure(d, err, errlen);
    }
    command *c = queue_slot(d);
    if (c->capacity < b->n_experts) {
        eb_rt_expert *ex = realloc(c->experts, (size_t)b->n_experts * sizeof *ex);
        int32_t *ps = ex ? realloc(c->pair_start, ((size_t)b->n_experts + 1) * sizeof *ps) : NULL;
        if (ex) c->experts = ex;
        if (ps) c->pair_start = ps;
        if (!ex || !ps) {
            pthread_mutex_unlock(&d->qmu);
            return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
        }
        c->capacity = b->n_experts;
    }
    memcpy(c->experts, b->experts, (size_t)b->n_experts * sizeof *c->experts);
    memcpy(c->pair_start, b->pair_start, ((size_t)b->n_experts + 1) * sizeof *c->pair_start);
    c->kind = CMD_FFN;
    c->batch = *b;
    c->batch.experts = c->experts;
    c->batch.pair_start = c->pair_start;
    queue_push(d);
    return 0;
}


static int cpu_event_create(void *rtp, int dev, void **event, char *err, size_t errlen) {
    *event = NULL;
    if (!get_dev((cpu_runtime *)rtp, dev, err, errlen)) return EB_ERR_RANGE;
    cpu_event *e = calloc(1, sizeof *e);
    if (!e) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    *event = e;
    return 0;
}

static void cpu_event_destroy(void *rtp, int dev, void *event) {
    (void)rtp, (void)dev;
    free(event);
}

static int cpu_event_record(void *rtp, int dev, void *event, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_event *e = event;
    atomic_store(&e->pending, 1);
    command *c = queue_slot(d);
    c->kind = CMD_EVENT;
    c->event = e;
    queue_push(d);
    return 0;
}

static int cpu_event_wait(void *rtp, int dev, void *event, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_event *e = event;
    /* spin briefly: a join usually follows the work it waits for by microseconds */
    for (int spins = 0; spins < SPIN_ITERATIONS && atomic_load(&e->pending); spins++) cpu_relax();
    if (!atomic_load(&e->pending)) return queued_failure(d, err, errlen);
    pthread_mutex_lock(&d->qmu);
    while (atomic_load(&e->pending)) pthread_cond_wait(&d->q_idle, &d->qmu);
    pthread_mutex_unlock(&d->qmu);
    return queued_failure(d, err, errlen);
}

static int cpu_event_time(void *rtp, int dev, void *event, uint64_t *ns, char *err, size_t errlen) {
    if (!get_dev((cpu_runtime *)rtp, dev, err, errlen)) return EB_ERR_RANGE;
    const cpu_event *e = event;
    if (atomic_load(&e->pending))
        return eb_rt_fail(err, errlen, EB_ERR_STATE, RUNTIME_NAME ":%d: the event has not been reached yet", dev);
    *ns = e->ns;
    return 0;
}

static uint64_t cpu_busy_ns(void *rtp, int dev) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    return dev >= 0 && dev < rt->n_devices ? atomic_load(&rt->devices[dev].busy_ns) : 0;
}

/* ---- the forward pass (the primary's operations) ------------------------------------------------------------
 *
 * Each operation waits for the device's queue to drain, then runs on the calling thread with the device's
 * workers. The cpu and hostsim builds share this code, so a hostsim primary gives a cpu primary's bits. */


static void drain(cpu_device *d) {
    pthread_mutex_lock(&d->qmu);
    while (d->count > 0) pthread_cond_wait(&d->q_idle, &d->qmu);
    pthread_mutex_unlock(&d->qmu);
}

static cpu_device *op_begin(void *rtp, int dev, uint64_t *t0, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return NULL;
    drain(d);
    *t0 = now_ns();
    pthread_mutex_lock(&d->run_lock);
    return d;
}

static int op_end(cpu_device *d, uint64_t t0, int st) {
    pthread_mutex_unlock(&d->run_lock);
    atomic_fetch_add(&d->busy_ns, now_ns() - t0);
    return st;
}

/* The device's scratch of at least bytes (run_lock held); NULL when it cannot grow. */
static void *scratch(cpu_device *d, size_t bytes) { return grown(&d->scratch, &d->scratch_cap, bytes); }

static int op_check_model(void *rtp, int dev, const eb_rt_model_shape *shape, char *err, size_t errlen) {
    if (!get_dev((cpu_runtime *)rtp, dev, err, errlen)) return EB_ERR_RANGE;
    if (shape->head_dim % 2 != 0)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED, RUNTIME_NAME " runtime: head_dim %d: rotate-half RoPE needs "
                          "an even head_dim", shape->head_dim);
    return 0;
}

static int op_embed(void *rtp, int dev, const void *table, int dtype, const eb_rt_scale *scale, int64_t hidden,
                    const int32_t *ids, int64_t n, float *x, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    const float *grid = scale ? scale->data : NULL;
    for (int64_t t = 0; t < n; t++) {
        const unsigned char *row = (const unsigned char *)table + (size_t)ids[t] * eb_row_bytes(dtype, hidden);
        ((cpu_runtime *)rtp)->kernels.format[dtype].dequantize(row, eb_scale_row(grid, dtype, ids[t], hidden), hidden,
                                                               x + t * hidden);
    }
    return op_end(d, t0, 0);
}

static void norm_rows(const eb_rt_norm *norm) {
    for (int64_t r = 0; r < norm->n; r++)
        eb_rmsnorm(norm->xn + r * norm->dim, norm->x + r * norm->dim, norm->w, norm->dim, norm->eps);
}

static int op_matmul(void *rtp, int dev, const eb_rt_norm *norm, const eb_rt_matmul *tasks, int n_tasks,
                     int accumulate, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_runtime *rt = (cpu_runtime *)rtp;
    if (norm) norm_rows(norm);
    if (!accumulate) {
        if (run_multi(rt, d, tasks, n_tasks))
            return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
        return op_end(d, t0, 0);
    }
    /* y += w x: the product into scratch first, then one addition per element */
    for (int i = 0; i < n_tasks; i++) {
        const eb_rt_matmul *t = &tasks[i];
        size_t count = (size_t)t->n * (size_t)t->rows;
        float *tmp = scratch(d, count * sizeof *tmp);
        if (!tmp) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
        eb_rt_matmul one = *t;
        one.y = tmp;
        if (run_multi(rt, d, &one, 1))
            return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
        for (size_t k = 0; k < count; k++) t->y[k] += tmp[k];
    }
    return op_end(d, t0, 0);
}

static int op_add(void *rtp, int dev, float *y, const float *b, int64_t n, int64_t dim, int broadcast, char *err,
                  size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < dim; i++) y[r * dim + i] += b[(broadcast ? 0 : r * dim) + i];
    return op_end(d, t0, 0);
}

static int op_silu_mul(void *rtp, int dev, float *g, const float *u, int64_t n, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    for (int64_t i = 0; i < n; i++) g[i] = eb_silu(g[i]) * u[i];
    return op_end(d, t0, 0);
}

/* Attention's work items: `heads` query heads of one GQA group each (their key and value rows read once together),
 * every head with its own row of scores. */
typedef struct {
    const eb_rt_attention *a;
    int64_t pos, heads, stride; /* stride: a head's scores, the most positions a row attends to */
    float *scores;
} attention_job;

#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void attend_items(void *arg, int64_t i0, int64_t i1) {
    const attention_job *j = (const attention_job *)arg;
    const eb_rt_attention *a = j->a;
    int64_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads, g = j->heads;
    int64_t qd = (int64_t)a->n_heads * hd, kvd = (int64_t)a->n_kv_heads * hd;
    for (int64_t i = i0; i < i1; i++) {
        int64_t h = i * g, kvh = h / group;
        for (int64_t t = 0; t < a->n; t++) {
            int64_t p = j->pos + t, lo = a->window && p >= a->window ? p - a->window + 1 : 0;
            eb_attend_span(a->q + t * qd + h * hd, g, a->k_cache + kvh * hd, a->v_cache + kvh * hd, lo, p, a->n_cache,
                           a->sinks ? a->sinks + h : NULL, kvd, hd, j->scores + h * j->stride, j->stride,
                           a->out + t * qd + h * hd);
        }
    }
}

static void attend_portable(void *arg, int64_t i0, int64_t i1) { attend_items(arg, i0, i1); }

/* The same built for AVX2 where the kernels are: eb_attend_group's sums are eight lanes with nothing reassociated
 * or contracted (-ffp-contract=off), so the wider build gives the same bits with half the instructions. Chosen at
 * init rather than through an ifunc, which the sanitizer runtimes do not survive. */
#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_ATTENTION_AVX2 1
__attribute__((target("avx2"))) static void attend_avx2(void *arg, int64_t i0, int64_t i1) { attend_items(arg, i0, i1); }
#endif

static int op_attention(void *rtp, int dev, const eb_rt_attention *a, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_runtime *rt = (cpu_runtime *)rtp;
    int64_t hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads;
    int64_t qd = nh * hd, kvd = nkv * hd, pos = *a->pos;
    int64_t stride = a->window && a->window < a->n_ctx ? a->window : a->n_ctx;
    float *scores = scratch(d, (size_t)nh * (size_t)stride * sizeof(float));
    if (!scores) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    for (int64_t t = 0; t < a->n; t++)
        eb_qk_rope_store(a->q + t * qd, a->k + t * kvd, a->v + t * kvd, a->q_norm, a->k_norm, a->rope_cos, a->rope_sin,
                         a->k_cache, a->v_cache, pos + t, (pos + t) % a->n_cache, nh, nkv, hd, a->eps);
    /* a whole GQA group per work item where there are at least as many groups as threads, else one head (more
     * items than threads): the bits are the same either way */
    attention_job job = {a, pos, d->pool.n_threads <= nkv ? nh / nkv : 1, stride, scores};
    pool_fn attend = attend_portable;
#if defined(CPU_ATTENTION_AVX2) && defined(EB_CPU_HAVE_AVX2_BUILD)
    if (rt->avx2) attend = attend_avx2;
#endif
    trace_note(TRACE_PARALLEL_FOR, 0);
    pool_run(&d->pool, attend, &job, nh / job.heads, 1, 0);
    return op_end(d, t0, 0);
}

static int op_route(void *rtp, int dev, const eb_rt_route *r, char *err, size_t errlen) {
    if (r->scoring != EB_ROUTE_SOFTMAX_TOPK && r->scoring != EB_ROUTE_SIGMOID_GROUP &&
        r->scoring != EB_ROUTE_TOPK_SOFTMAX)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED, RUNTIME_NAME " runtime: router scoring %d: expected %d "
                          "(softmax top-k), %d (sigmoid, grouped) or %d (top-k, softmax)", r->scoring,
                          EB_ROUTE_SOFTMAX_TOPK, EB_ROUTE_SIGMOID_GROUP, EB_ROUTE_TOPK_SOFTMAX);
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    int64_t n = r->norm.n, E = r->n_experts, K = r->top_k;
    float *choice = NULL;
    if (r->scoring == EB_ROUTE_SIGMOID_GROUP && !(choice = scratch(d, (size_t)E * sizeof *choice)))
        return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    norm_rows(&r->norm);
    /* the router in f32 whatever the precision: the choice of experts is what a precision must not move */
    eb_rt_matmul logits = {r->router, r->router_dtype, E,   r->norm.dim,    r->norm.xn,
                           n,         r->logits,       EB_PRECISION_F32, r->router_scale};
    (void)run_multi((cpu_runtime *)rtp, d, &logits, 1); /* f32 needs no quantized activations: it cannot fail */
    for (int64_t t = 0; t < n; t++) {
        if (choice)
            eb_route_sigmoid_group_row(r->logits + t * E, choice, r->bias, E, K, r->n_group, r->topk_group,
                                       r->norm_topk, r->scale, r->topk_id + t * K, r->topk_w + t * K);
        else if (r->scoring == EB_ROUTE_TOPK_SOFTMAX)
            eb_route_topk_softmax_row(r->logits + t * E, r->bias, E, K, r->topk_id + t * K, r->topk_w + t * K);
        else
            eb_route_row(r->logits + t * E, E, K, r->norm_topk, r->topk_id + t * K, r->topk_w + t * K);
        if (r->hits)
            for (int64_t k = 0; k < K; k++) r->hits[r->topk_id[t * K + k]]++;
    }
    return op_end(d, t0, 0);
}

/* MLA's work items: one head each, every row of the step, with its own scratch (the absorbed query, the rotated
 * rope query, the latent mix and a row of scores). */
typedef struct {
    const eb_rt_mla *a;
    const eb_cpu_kernel_set *k;
    int64_t pos;
    float *scratch;
} mla_job;

static void mla_heads(void *arg, int64_t h0, int64_t h1) {
    const mla_job *j = (const mla_job *)arg;
    const eb_rt_mla *a = j->a;
    int64_t R = a->rank, P = a->rope, N = a->nope, V = a->v_dim, C = R + P, qw = N + P;
    float scale = a->scale;
    size_t kb_head = (size_t)R * eb_row_bytes(a->k_b_dtype, N);
    size_t vb_head = (size_t)a->v_b_head_rows * eb_row_bytes(a->v_b_dtype, R);
    for (int64_t h = h0; h < h1; h++) {
        float *ql = j->scratch + h * (2 * R + P + a->n_ctx), *qp = ql + R, *ol = qp + P, *sc = ol + R;
        for (int64_t t = 0; t < a->n; t++) {
            int64_t p = j->pos + t;
            const float *q = a->q + (t * a->n_heads + h) * qw;
            memcpy(qp, q + N, (size_t)P * sizeof *qp);
            const float *cs = a->rope_cos + p * (P / 2), *sn = a->rope_sin + p * (P / 2);
            if (a->interleave) eb_rope_interleaved(qp, cs, sn, P);
            else eb_rope(qp, cs, sn, P);
            /* the query's nope part through the key half of kv_b: its dot with the latent is q_nope . k_nope */
            product(j->k, (const unsigned char *)a->k_b + (size_t)h * kb_head, a->k_b_dtype, NULL, 0, R, N, q, NULL, 1,
                    ql, R);
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t s = 0; s <= p; s++) {
                const float *row = a->cache + s * C;
                float v = (eb_dot_qk(ql, row, R) + eb_dot_qk(qp, row + R, P)) * scale;
                sc[s] = v;
                if (v > mx) mx = v;
            }
            for (int64_t s = 0; s <= p; s++) {
                sc[s] = expf(sc[s] - mx);
                sum += sc[s];
            }
            float inv = 1.0f / sum;
            memset(ol, 0, (size_t)R * sizeof *ol);
            for (int64_t s = 0; s <= p; s++) {
                const float *restrict row = a->cache + s * C;
                float ps = sc[s] * inv;
                for (int64_t i = 0; i < R; i++) ol[i] += ps * row[i];
            }
            product(j->k, (const unsigned char *)a->v_b + (size_t)h * vb_head, a->v_b_dtype, NULL, 0, V, R, ol, NULL,
                    1, a->out + (t * a->n_heads + h) * V, V);
        }
    }
}

static int op_mla(void *rtp, int dev, const eb_rt_mla *a, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_runtime *rt = (cpu_runtime *)rtp;
    int64_t R = a->rank, P = a->rope, C = R + P, pos = *a->pos;
    float *mem = scratch(d, (size_t)a->n_heads * (size_t)(2 * R + P + a->n_ctx) * sizeof(float));
    if (!mem) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    for (int64_t t = 0; t < a->n; t++) { /* the new rows' latent and rope key into the cache */
        float *row = a->cache + (pos + t) * C;
        const float *kv = a->kv + t * C, *cs = a->rope_cos + (pos + t) * (P / 2), *sn = a->rope_sin + (pos + t) * (P / 2);
        eb_rmsnorm(row, kv, a->kv_norm, R, a->eps);
        memcpy(row + R, kv + R, (size_t)P * sizeof *row);
        if (a->interleave) eb_rope_interleaved(row + R, cs, sn, P);
        else eb_rope(row + R, cs, sn, P);
    }
    mla_job job = {a, &rt->kernels, pos, mem};
    trace_note(TRACE_PARALLEL_FOR, 0);
    pool_run(&d->pool, mla_heads, &job, a->n_heads, 1, 0);
    return op_end(d, t0, 0);
}

/* The owned experts' pairs as one batch (experts ascending, each expert's pairs in ascending row order, as the
 * core's scheduler builds them for a peer), each pair's output then moved to its row of pair_out. */
static int moe_experts(cpu_runtime *rt, cpu_device *d, const eb_rt_moe *b, char *err, size_t errlen) {
    int64_t n = b->n, K = b->top_k, E = b->n_experts, H = b->hidden, I = b->inter, NK = n * K;
    size_t ex_bytes = (size_t)(E > NK ? NK : E) * sizeof(eb_rt_expert), idx_bytes = (size_t)NK * sizeof(int32_t);
    size_t y_bytes = (size_t)NK * (size_t)H * sizeof(float), work = eb_rt_expert_scratch_bytes(NK, H, I);
    size_t at[5] = {0}, bytes = 0, sizes[5] = {ex_bytes, idx_bytes + sizeof(int32_t), idx_bytes, idx_bytes, y_bytes};
    for (int i = 0; i < 5; i++) at[i] = bytes, bytes += (sizes[i] + 63) / 64 * 64;
    unsigned char *mem = scratch(d, bytes + work);
    if (!mem) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    eb_rt_expert *experts = (eb_rt_expert *)(mem + at[0]);
    int32_t *start = (int32_t *)(mem + at[1]), *pair_token = (int32_t *)(mem + at[2]), *slot = (int32_t *)(mem + at[3]);
    float *y = (float *)(mem + at[4]);
    int32_t ne = 0, p = 0;
    for (int32_t e = 0; e < E; e++) {
        if (!b->experts[e].gate) continue;
        int32_t first = p;
        p = eb_group_pairs(b->topk_id, n, K, e, pair_token, slot, p);
        if (p == first) continue;
        experts[ne] = b->experts[e];
        start[ne++] = first;
    }
    start[ne] = p;
    eb_rt_expert_batch batch = {.n_experts = ne, .experts = experts, .pair_start = start, .n_pairs = p,
                                .n_tokens = (int32_t)n, .hidden = (int32_t)H, .inter = (int32_t)I,
                                .mode = EB_REDUCE_REFERENCE, .x = b->xn, .pair_token = pair_token, .y = y,
                                .scratch = mem + bytes, .scratch_bytes = work, .precision = b->precision,
                                .act = b->act};
    if (p > 0 && run_expert_batch(rt, d, &batch))
        return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    for (int32_t i = 0; i < p; i++) memcpy(b->pair_out + (int64_t)slot[i] * H, y + (int64_t)i * H, (size_t)H * sizeof(float));
    if (b->stats) b->stats[0] += (unsigned long long)ne, b->stats[1] += (unsigned long long)p;
    return 0;
}

static int op_moe(void *rtp, int dev, const eb_rt_moe *b, char *err, size_t errlen) {
    if (b->phase != EB_MOE_ALL && b->phase != EB_MOE_EXPERTS && b->phase != EB_MOE_COMBINE)
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: moe phase %d: expected %d, %d or %d",
                          b->phase, EB_MOE_ALL, EB_MOE_EXPERTS, EB_MOE_COMBINE);
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    int st = 0;
    if (b->phase != EB_MOE_COMBINE) st = moe_experts((cpu_runtime *)rtp, d, b, err, errlen);
    if (!st && b->phase != EB_MOE_EXPERTS)
        for (int64_t t = 0; t < b->n && !st; t++)
            if (!eb_moe_combine_row(b->x, t, b->top_k, b->hidden, b->topk_id, b->topk_w, b->experts,
                                    b->pair_out, b->foreign, b->mode == EB_REDUCE_OWNER_LOCAL))
                st = eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: a selected expert is not owned "
                                "and no foreign outputs were given");
    return op_end(d, t0, st);
}

#ifndef EB_CPU_HOSTSIM
static const eb_rt_forward_ops cpu_forward = {
    .check_model = op_check_model,
    .embed = op_embed,
    .matmul = op_matmul,
    .add = op_add,
    .silu_mul = op_silu_mul,
    .attention = op_attention,
    .route = op_route,
    .moe = op_moe,
};
static const eb_rt_mla_ops cpu_mla = {.mla = op_mla};
static const eb_rt_extension cpu_extensions[] = {
    {{EB_EXT_MLA, EB_EXT_MLA_VERSION}, &cpu_mla},
    {{NULL, 0}, NULL},
};
#define FORWARD_OPS (&cpu_forward)
#define EXTENSIONS cpu_extensions
#define GRAPH_OPS NULL
#else
/* Graphs (hostsim only, so that the core's recording and replaying of steps runs without a GPU): between begin
 * and end the recording thread's operations are stored (their arguments copied) instead of run; launch runs them
 * again in order. Other threads' operations run as usual. */
enum { OP_EMBED, OP_MATMUL, OP_ADD, OP_SILU_MUL, OP_ATTENTION, OP_ROUTE, OP_MOE, OP_MLA };
#define SIM_MAX_TASKS 8

typedef struct {
    int kind;
    const void *in0, *in1;
    void *out;
    int64_t n, dim;
    int flag; /* dtype (embed), accumulate (matmul), broadcast (add) */
    int has_norm, n_tasks;
    eb_rt_norm norm;
    eb_rt_matmul tasks[SIM_MAX_TASKS];
    eb_rt_attention attention;
    eb_rt_route route;
    eb_rt_moe moe;
    eb_rt_mla mla;
    eb_rt_scale scale; /* embed: the table's scale companion */
} sim_op;

typedef struct {
    sim_op *ops;
    int n, cap;
} sim_graph;

/* The graph this thread is recording (compared, never read through, when deciding whether to record: another
 * thread's graph may be freed at any time). */
static _Thread_local sim_graph *recording_here;

static int run_op(void *rtp, int dev, const sim_op *o, char *err, size_t errlen) {
    switch (o->kind) {
    case OP_EMBED:
        return op_embed(rtp, dev, o->in0, o->flag, &o->scale, o->dim, o->in1, o->n, o->out, err, errlen);
    case OP_MATMUL:
        return op_matmul(rtp, dev, o->has_norm ? &o->norm : NULL, o->tasks, o->n_tasks, o->flag, err, errlen);
    case OP_ADD:
        return op_add(rtp, dev, o->out, o->in0, o->n, o->dim, o->flag, err, errlen);
    case OP_SILU_MUL:
        return op_silu_mul(rtp, dev, o->out, o->in0, o->n, err, errlen);
    case OP_ATTENTION:
        return op_attention(rtp, dev, &o->attention, err, errlen);
    case OP_ROUTE:
        return op_route(rtp, dev, &o->route, err, errlen);
    case OP_MLA:
        return op_mla(rtp, dev, &o->mla, err, errlen);
    default:
        return op_moe(rtp, dev, &o->moe, err, errlen);
    }
}

/* Record o when this thread is recording on dev (*recorded = 1), else leave it to the caller to run. */
static int record(void *rtp, int dev, const sim_op *o, int *recorded, char *err, size_t errlen) {
    *recorded = 0;
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    sim_graph *g = atomic_load(&d->recording);
    if (!g || g != recording_here) return 0;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        sim_op *ops = realloc(g->ops, (size_t)cap * sizeof *ops);
        if (!ops) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
        g->ops = ops;
        g->cap = cap;
    }
    g->ops[g->n++] = *o;
    *recorded = 1;
    return 0;
}

static int submit(void *rtp, int dev, const sim_op *o, char *err, size_t errlen) {
    int recorded, st = record(rtp, dev, o, &recorded, err, errlen);
    return st || recorded ? st : run_op(rtp, dev, o, err, errlen);
}

static int sim_embed(void *rtp, int dev, const void *table, int dtype, const eb_rt_scale *scale, int64_t hidden,
                     const int32_t *ids, int64_t n, float *x, char *err, size_t errlen) {
    sim_op o = {.kind = OP_EMBED, .in0 = table, .in1 = ids, .out = x, .n = n, .dim = hidden, .flag = dtype};
    if (scale) o.scale = *scale;
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_matmul(void *rtp, int dev, const eb_rt_norm *norm, const eb_rt_matmul *tasks, int n_tasks,
                      int accumulate, char *err, size_t errlen) {
    if (n_tasks > SIM_MAX_TASKS) /* the core's steps pass at most three */
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: %d products in one call, at most %d",
                          n_tasks, SIM_MAX_TASKS);
    sim_op o = {.kind = OP_MATMUL, .has_norm = norm != NULL, .n_tasks = n_tasks, .flag = accumulate};
    if (norm) o.norm = *norm;
    memcpy(o.tasks, tasks, (size_t)n_tasks * sizeof *tasks);
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_add(void *rtp, int dev, float *y, const float *b, int64_t n, int64_t dim, int broadcast, char *err,
                   size_t errlen) {
    sim_op o = {.kind = OP_ADD, .in0 = b, .out = y, .n = n, .dim = dim, .flag = broadcast};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_silu_mul(void *rtp, int dev, float *g, const float *u, int64_t n, char *err, size_t errlen) {
    sim_op o = {.kind = OP_SILU_MUL, .in0 = u, .out = g, .n = n};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_attention(void *rtp, int dev, const eb_rt_attention *a, char *err, size_t errlen) {
    sim_op o = {.kind = OP_ATTENTION, .attention = *a};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_route(void *rtp, int dev, const eb_rt_route *r, char *err, size_t errlen) {
    sim_op o = {.kind = OP_ROUTE, .route = *r};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_moe(void *rtp, int dev, const eb_rt_moe *b, char *err, size_t errlen) {
    sim_op o = {.kind = OP_MOE, .moe = *b};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_mla(void *rtp, int dev, const eb_rt_mla *a, char *err, size_t errlen) {
    sim_op o = {.kind = OP_MLA, .mla = *a};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_graph_begin(void *rtp, int dev, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    sim_graph *g = calloc(1, sizeof *g);
    if (!g) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&d->recording, &none, g)) {
        free(g);
        return eb_rt_fail(err, errlen, EB_ERR_STATE, RUNTIME_NAME ":%d is already recording", dev);
    }
    recording_here = g;
    return 0;
}

static void sim_graph_free(void *rtp, int dev, void *graph) {
    (void)rtp, (void)dev;
    sim_graph *g = graph;
    if (g) free(g->ops);
    free(g);
}

static int sim_graph_end(void *rtp, int dev, void **graph, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    sim_graph *g = atomic_exchange(&d->recording, NULL);
    if (!g) return eb_rt_fail(err, errlen, EB_ERR_STATE, RUNTIME_NAME ":%d is not recording", dev);
    if (g == recording_here) recording_here = NULL;
    if (graph) *graph = g;
    else sim_graph_free(rtp, dev, g);
    return 0;
}

static int sim_graph_launch(void *rtp, int dev, void *graph, char *err, size_t errlen) {
    const sim_graph *g = graph;
    for (int i = 0; i < g->n; i++) {
        int st = run_op(rtp, dev, &g->ops[i], err, errlen);
        if (st) return st;
    }
    return 0;
}

static const eb_rt_forward_ops sim_forward = {
    .check_model = op_check_model,
    .embed = sim_embed,
    .matmul = sim_matmul,
    .add = sim_add,
    .silu_mul = sim_silu_mul,
    .attention = sim_attention,
    .route = sim_route,
    .moe = sim_moe,
};
static const eb_rt_mla_ops sim_mla_ops = {.mla = sim_mla};
static const eb_rt_extension sim_extensions[] = {
    {{EB_EXT_MLA, EB_EXT_MLA_VERSION}, &sim_mla_ops},
    {{NULL, 0}, NULL},
};

static const eb_rt_graph_ops sim_graphs = {
    .begin = sim_graph_begin,
    .end = sim_graph_end,
    .launch = sim_graph_launch,
    .free = sim_graph_free,
};
#define FORWARD_OPS (&sim_forward)
#define GRAPH_OPS (&sim_graphs)
#define EXTENSIONS sim_extensions
#endif

static const eb_runtime_table cpu_table = {
    .abi_version = EB_RUNTIME_ABI_VERSION,
    .table_size = sizeof(eb_runtime_table),
    .name = RUNTIME_NAME,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .kernel_variant = cpu_kernel_variant,
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .busy_ns = cpu_busy_ns,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_time = cpu_event_time,
    .expert_ffn = cpu_expert_ffn,
    .forward = FORWARD_OPS,
    .graphs = GRAPH_OPS,
    .extensions = EXTENSIONS,
};

EB_EXPORT const eb_runtime_table *eb_runtime_module(void) { return &cpu_table; }
