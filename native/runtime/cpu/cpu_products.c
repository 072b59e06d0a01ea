/* The cpu module's products and expert batches: rows split over a device's pool, each row by one thread through
 * the kernels of its format and precision (cpu_kernels.h). */
#define _GNU_SOURCE
#include "cpu_module.h"

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
void product(const eb_cpu_kernel_set *k, const void *w, int dtype, const float *scale, int64_t r0, int64_t r1,
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
void *grown(void **buf, size_t *cap, size_t bytes) {
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

int run_multi(cpu_runtime *rt, cpu_device *d, const eb_rt_matmul *tasks, int n_tasks) {
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

int run_expert_batch(cpu_runtime *rt, cpu_device *d, const eb_rt_expert_batch *b) {
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
