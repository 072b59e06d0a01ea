/* The cpu runtime module: devices are groups of worker threads over host memory.
 *
 * Each device owns a small thread pool; the calling thread works too. Work is split by output rows, and
 * each row is computed entirely by one thread, so results do not depend on the number of threads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "eb_convert.h"
#include "eb_runtime.h"

#define SPIN_ITERATIONS 20000

typedef void (*pool_fn)(void *arg, int64_t begin, int64_t end);

typedef struct {
    int n_threads; /* including the calling thread */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    _Atomic uint64_t generation;
    _Atomic int stop;
    _Atomic int pending;
    _Atomic int64_t next;
    pool_fn fn;
    void *arg;
    int64_t total;
    int64_t chunk;
} pool;

typedef struct {
    pool pool;
    int index;
} cpu_device;

typedef struct {
    int n_devices;
    cpu_device *devices;
    eb_cpu_matmul_rows_fn matmul_rows;
    const char *variant;
    char cpu_name[EB_MAX_NAME];
} cpu_runtime;

static void set_err(char *err, size_t errlen, const char *fmt, const char *detail) {
    if (err && errlen) snprintf(err, errlen, fmt, detail);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void pool_work(pool *p) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->total) break;
        int64_t e = b + p->chunk < p->total ? b + p->chunk : p->total;
        p->fn(p->arg, b, e);
    }
}

static void *pool_worker(void *arg) {
    pool *p = (pool *)arg;
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERATIONS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->generation);
        pool_work(p);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void pool_run(pool *p, pool_fn fn, void *arg, int64_t total, int64_t chunk) {
    if (total <= 0) return;
    if (p->n_threads <= 1 || total <= chunk) {
        fn(arg, 0, total);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->total = total;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n_threads - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    pool_work(p);
    int spins = 0;
    while (atomic_load(&p->pending) > 0) {
        if (++spins < SPIN_ITERATIONS) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

static int pool_init(pool *p, int n_threads) {
    memset(p, 0, sizeof *p);
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (p->n_threads == 1) return 0;
    p->workers = calloc((size_t)p->n_threads - 1, sizeof *p->workers);
    if (!p->workers) return EB_ERR_MEMORY;
    for (int i = 0; i < p->n_threads - 1; i++) {
        if (pthread_create(&p->workers[i], NULL, pool_worker, p) != 0) {
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
    }
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
}

static int available_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
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
                snprintf(out, len, "%s", colon);
            }
            break;
        }
    }
    fclose(f);
}

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
        fclose(f);
    }
    return (uint64_t)kb * 1024u;
}

static void cpu_shutdown(void *rtp) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    if (!rt) return;
    for (int i = 0; i < rt->n_devices; i++) pool_destroy(&rt->devices[i].pool);
    free(rt->devices);
    free(rt);
}

static int cpu_init(const eb_runtime_options *opt, void **out, char *err, size_t errlen) {
    *out = NULL;
    cpu_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) {
        set_err(err, errlen, "%s", "cpu runtime: out of memory");
        return EB_ERR_MEMORY;
    }
    int cores = available_cores();
    int n_dev = opt && opt->n_devices > 0 ? opt->n_devices : 1;
    if (n_dev > 64) {
        free(rt);
        set_err(err, errlen, "%s", "cpu runtime: n_devices must be between 1 and 64");
        return EB_ERR_ARGUMENT;
    }
    int threads = opt && opt->threads_per_device > 0 ? opt->threads_per_device : cores / n_dev;
    if (threads < 1) threads = 1;
    int portable = opt && opt->force_portable;
#ifdef EB_CPU_HAVE_AVX2_BUILD
    __builtin_cpu_init();
    if (!portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        rt->matmul_rows = eb_cpu_matmul_rows_avx2;
        rt->variant = "avx2+fma+f16c";
    }
#endif
    if (!rt->matmul_rows) {
        rt->matmul_rows = eb_cpu_matmul_rows_portable;
        rt->variant = "portable";
    }
    read_cpu_name(rt->cpu_name, sizeof rt->cpu_name);
    rt->devices = calloc((size_t)n_dev, sizeof *rt->devices);
    if (!rt->devices) {
        free(rt);
        set_err(err, errlen, "%s", "cpu runtime: out of memory");
        return EB_ERR_MEMORY;
    }
    for (int i = 0; i < n_dev; i++) {
        rt->devices[i].index = i;
        rt->n_devices = i + 1;
        if (pool_init(&rt->devices[i].pool, threads) != 0) {
            cpu_shutdown(rt);
            set_err(err, errlen, "%s", "cpu runtime: could not start worker threads");
            return EB_ERR_DEVICE;
        }
    }
    *out = rt;
    return 0;
}

static const char *cpu_kernel_variant(void *rtp) { return ((cpu_runtime *)rtp)->variant; }

static int cpu_device_count(void *rtp) { return ((cpu_runtime *)rtp)->n_devices; }

static int check_dev(cpu_runtime *rt, int dev, char *err, size_t errlen) {
    if (dev < 0 || dev >= rt->n_devices) {
        if (err && errlen) snprintf(err, errlen, "cpu runtime: no device %d (it has %d)", dev, rt->n_devices);
        return EB_ERR_RANGE;
    }
    return 0;
}

static int cpu_device_info(void *rtp, int dev, eb_rt_device_info *info, char *err, size_t errlen) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    int st = check_dev(rt, dev, err, errlen);
    if (st) return st;
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%.40s", rt->cpu_name);
    snprintf(info->kind, sizeof info->kind, "cpu");
    struct sysinfo si;
    if (sysinfo(&si) == 0) info->memory_total = (uint64_t)si.totalram * si.mem_unit;
    info->memory_free = mem_available();
    info->threads = rt->devices[dev].pool.n_threads;
    info->host_addressable = 1;
    return 0;
}

static int cpu_mem_alloc(void *rtp, int dev, size_t bytes, void **ptr, char *err, size_t errlen) {
    int st = check_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (st) return st;
    size_t rounded = (bytes + 63) / 64 * 64;
    *ptr = aligned_alloc(64, rounded ? rounded : 64);
    if (!*ptr) {
        if (err && errlen) snprintf(err, errlen, "cpu runtime: could not allocate %zu bytes", bytes);
        return EB_ERR_MEMORY;
    }
    return 0;
}

static void cpu_mem_free(void *rtp, int dev, void *ptr) {
    (void)rtp;
    (void)dev;
    free(ptr);
}

static int cpu_copy(void *rtp, int dev, void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
    int st = check_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (st) return st;
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

static int cpu_synchronize(void *rtp, int dev, char *err, size_t errlen) {
    return check_dev((cpu_runtime *)rtp, dev, err, errlen);
}

typedef struct {
    eb_cpu_matmul_rows_fn fn;
    const void *w;
    int dtype;
    int64_t cols;
    const float *x;
    int64_t n;
    float *y;
    int64_t ldy;
} matmul_job;

static void matmul_chunk(void *arg, int64_t begin, int64_t end) {
    matmul_job *j = (matmul_job *)arg;
    j->fn(j->w, j->dtype, begin, end, j->cols, j->x, j->n, j->y, j->ldy);
}

static int cpu_matmul(void *rtp, int dev, const void *w, int dtype, int64_t rows, int64_t cols, const float *x,
                      int64_t n, float *y, char *err, size_t errlen) {
    cpu_runtime *rt = (cpu_runtime *)rtp;
    int st = check_dev(rt, dev, err, errlen);
    if (st) return st;
    if (eb_dtype_size(dtype) == 0) {
        if (err && errlen) snprintf(err, errlen, "cpu runtime: unknown weight dtype %d", dtype);
        return EB_ERR_UNSUPPORTED;
    }
    matmul_job job = {rt->matmul_rows, w, dtype, cols, x, n, y, rows};
    pool *p = &rt->devices[dev].pool;
    /* Enough chunks for load balance, each big enough (about 16 KiB of weights) to amortise the hand-off. */
    int64_t min_rows = (int64_t)(16384 / ((size_t)cols * eb_dtype_size(dtype) + 1)) + 1;
    int64_t chunk = rows / ((int64_t)p->n_threads * 4);
    if (chunk < min_rows) chunk = min_rows;
    pool_run(p, matmul_chunk, &job, rows, chunk);
    return 0;
}

static const eb_runtime_table cpu_table = {
    .abi_version = EB_RUNTIME_ABI_VERSION,
    .table_size = sizeof(eb_runtime_table),
    .name = "cpu",
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .kernel_variant = cpu_kernel_variant,
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .matmul = cpu_matmul,
};

EB_EXPORT const eb_runtime_table *eb_runtime_module(void) { return &cpu_table; }
