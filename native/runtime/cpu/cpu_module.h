/* The cpu runtime module's parts (cpu_runtime.c: devices, memory, queue and the table; cpu_pool.c: each device's
 * worker threads; cpu_products.c: products and expert batches over the kernels; cpu_forward.c: the primary's
 * operations, and their recording as graphs in the hostsim build): the types they share and what each gives the
 * others. Built twice, as "cpu" and as "hostsim" (-DEB_CPU_HOSTSIM); every symbol is hidden (-fvisibility=hidden)
 * but the module's entry. */
#ifndef EB_CPU_MODULE_H
#define EB_CPU_MODULE_H

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

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- what the parts give each other ------------------------------------------------------------------------ */

/* cpu_pool.c */
enum { TRACE_PARALLEL_FOR = 1, TRACE_MATMUL, TRACE_MULTI, TRACE_GATE_UP }; /* the kinds of pool run (trace) */
#ifdef EB_POOL_TRACE
void trace_note(int kind, uint64_t bytes); /* the kind and weight bytes of the pool run about to start */
void trace_alloc(void);
void trace_write(void);
#else
static inline void trace_note(int kind, uint64_t bytes) { (void)kind, (void)bytes; }
static inline void trace_alloc(void) {}
static inline void trace_write(void) {}
#endif
void pool_run(pool *p, pool_fn fn, void *arg, int64_t total, int64_t step, int per_thread);
int pool_init(pool *p, int n_threads);
void pool_destroy(pool *p);
/* cpu_products.c */
void product(const eb_cpu_kernel_set *k, const void *w, int dtype, const float *scale, int64_t r0, int64_t r1,
             int64_t cols, const float *x, const eb_cpu_q8_rows *xq, int64_t n, float *y, int64_t ldy);
void *grown(void **buf, size_t *cap, size_t bytes);
int run_multi(cpu_runtime *rt, cpu_device *d, const eb_rt_matmul *tasks, int n_tasks);
int run_expert_batch(cpu_runtime *rt, cpu_device *d, const eb_rt_expert_batch *b);
/* cpu_runtime.c */
cpu_device *get_dev(cpu_runtime *rt, int dev, char *err, size_t errlen);
/* cpu_forward.c */
extern const eb_rt_forward_ops eb_cpu_forward;
extern const eb_rt_extension eb_cpu_extensions[];
#ifdef EB_CPU_HOSTSIM
extern const eb_rt_graph_ops eb_cpu_graphs;
#define EB_CPU_GRAPHS (&eb_cpu_graphs)
#else
#define EB_CPU_GRAPHS NULL
#endif

#endif
