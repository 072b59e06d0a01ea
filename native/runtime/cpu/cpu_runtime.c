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
#include "cpu_module.h"

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
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
            __builtin_cpu_supports("bmi2")) {
            over(&rt->kernels, &eb_cpu_kernels_avx512);
            if (__builtin_cpu_supports("avx512vbmi")) over(&rt->kernels, &eb_cpu_kernels_avx512_vbmi);
        }
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

cpu_device *get_dev(cpu_runtime *rt, int dev, char *err, size_t errlen) {
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
    info->q8_formats = info->formats; /* the q8 precision is this module's own: every format it reads */
    info->kv_formats = 1u << EB_DTYPE_F16 | 1u << EB_DTYPE_BF16; /* eb_kv_store, eb_kv_row */
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
    .forward = &eb_cpu_forward,
    .graphs = EB_CPU_GRAPHS,
    .extensions = eb_cpu_extensions,
};

EB_EXPORT const eb_runtime_table *eb_runtime_module(void) { return &cpu_table; }
