/* The load's check that every weight holds numbers. A damaged file (a NaN or inf block scale, an MXFP4 exponent of
 * 255, an FP8 NaN byte, a NaN in a norm) otherwise gives NaN logits and the same token over and over, with no error.
 *
 * Each weight the core bound is dequantized as its kernels will read it, scales applied, with the core's own
 * dequantization (eb_formats.h), and its values tested: NaN, inf, or a magnitude no weight has (past
 * EB_WEIGHT_LIMIT: an MXFP4 exponent of 255 makes 2^127 of a unit, finite, and inf past it). So every format, present
 * and future, is covered without knowing where it keeps its scales.
 *
 * The weights are cut into parts (row ranges of at most check_part bytes) that a thread per CPU takes in the list's
 * order. A part after one found bad is skipped, one before it never is: the report is the first bad value of the
 * first bad weight in binding order, whatever the threads' timing.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eb_model.h"

int eb_checks_add(eb_weight_checks *list, const eb_checked_weight *item) {
    if (list->n == list->cap) {
        int64_t cap = list->cap ? 2 * list->cap : 256;
        eb_checked_weight *grown = realloc(list->items, (size_t)cap * sizeof *grown);
        if (!grown) return eb_fail(EB_ERR_MEMORY, "out of memory for the list of weights to check");
        list->items = grown, list->cap = cap;
    }
    char *name = strdup(item->name);
    if (!name) return eb_fail(EB_ERR_MEMORY, "out of memory for the list of weights to check");
    list->items[list->n] = *item;
    list->items[list->n++].name = name;
    return EB_OK;
}

void eb_checks_free(eb_weight_checks *list) {
    for (int64_t i = 0; i < list->n; i++) free(list->items[i].name);
    free(list->items);
    *list = (eb_weight_checks){NULL, 0, 0};
}

static uint64_t check_part = (uint64_t)8 << 20;
static int check_threads_used; /* by the last check (tests) */

void eb_set_check_part(uint64_t bytes) { check_part = bytes ? bytes : (uint64_t)8 << 20; }

int eb_check_threads_used(void) { return check_threads_used; }

typedef struct {
    int64_t item, r0, r1; /* rows r0..r1 - 1 of list item `item` */
    int64_t row, col;     /* the first bad value there (row -1: none) */
    float value;
} check_part_t;

typedef struct {
    const eb_weight_checks *list;
    check_part_t *parts;
    int64_t n_parts;
    _Atomic int64_t next;      /* the next part to take */
    _Atomic int64_t first_bad; /* the first part found bad so far (n_parts: none) */
} check_job;

/* Values dequantized at a time: whole blocks of every format (their blocks divide 256). */
enum { PIECE = 4096, MAX_CHECK_THREADS = 32 };

/* The column of row r's first value that no weight holds (*value: it), or -1. */
static int64_t scan_row(const eb_weight *w, int64_t r, float *buf, float *value) {
    const unsigned char *row = (const unsigned char *)w->data + (size_t)r * eb_row_bytes(w->dtype, w->cols);
    const float *scales = eb_scale_row(w->scale.data, w->dtype, r, w->cols);
    for (int64_t c0 = 0; c0 < w->cols; c0 += PIECE) {
        int64_t n = w->cols - c0 < PIECE ? w->cols - c0 : PIECE;
        eb_dequantize_row(row + eb_row_bytes(w->dtype, c0), w->dtype, n, buf);
        if (scales)
            for (int64_t i = 0; i < n; i++) buf[i] = buf[i] * scales[(c0 + i) / w->scale.cols];
        int64_t i = 0;
        for (; i + EB_CHUNK <= n; i += EB_CHUNK) { /* a fixed count the compiler vectorises at -O2 */
            int ok = 1;
            for (int k = 0; k < EB_CHUNK; k++) ok &= fabsf(buf[i + k]) <= EB_WEIGHT_LIMIT; /* false for NaN */
            if (!ok) break;
        }
        for (; i < n; i++)
            if (!(fabsf(buf[i]) <= EB_WEIGHT_LIMIT)) {
                *value = buf[i];
                return c0 + i;
            }
    }
    return -1;
}

static void *check_parts(void *arg) {
    check_job *j = (check_job *)arg;
    float buf[PIECE];
    for (;;) {
        int64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_parts) break;
        if (i > atomic_load(&j->first_bad)) continue; /* an earlier part is bad: this one cannot be the first */
        check_part_t *p = &j->parts[i];
        const eb_weight *w = &j->list->items[p->item].w;
        for (int64_t r = p->r0; r < p->r1 && p->row < 0; r++) {
            int64_t c = scan_row(w, r, buf, &p->value);
            if (c < 0) continue;
            p->row = r, p->col = c;
            int64_t seen = atomic_load(&j->first_bad);
            while (i < seen && !atomic_compare_exchange_weak(&j->first_bad, &seen, i)) {
            }
        }
    }
    return NULL;
}

static int check_threads(int64_t n_parts) {
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int n = cpus < MAX_CHECK_THREADS ? cpus : MAX_CHECK_THREADS;
    if (n > n_parts) n = (int)n_parts;
    return n < 1 ? 1 : n;
}

/* The refusal: the file, the tensor, the bad value's index in the tensor and what may have made it. */
static int report(const eb_model *m, const eb_checked_weight *it, const check_part_t *p) {
    int64_t el = it->base + p->row * it->row_stride + p->col / it->col_div, idx[4] = {0, 0, 0, 0};
    for (int d = it->ndim - 1; d >= 0; d--) {
        idx[d] = el % it->shape[d];
        el /= it->shape[d];
    }
    char at[128], what[96], hint[384];
    if (it->ndim == 1)
        snprintf(at, sizeof at, "index %lld", (long long)idx[0]);
    else if (it->ndim == 2)
        snprintf(at, sizeof at, "row %lld, column %lld", (long long)idx[0], (long long)idx[1]);
    else if (it->ndim == 3)
        snprintf(at, sizeof at, "index [%lld, %lld, %lld]", (long long)idx[0], (long long)idx[1], (long long)idx[2]);
    else
        snprintf(at, sizeof at, "index [%lld, %lld, %lld, %lld]", (long long)idx[0], (long long)idx[1],
                 (long long)idx[2], (long long)idx[3]);
    int huge = !isnan(p->value) && !isinf(p->value);
    if (huge)
        snprintf(what, sizeof what, "%g (a magnitude past 2^64, which no weight has)", (double)p->value);
    else
        snprintf(what, sizeof what, "%s", isnan(p->value) ? "NaN" : p->value > 0 ? "inf" : "-inf");
    const char *scale = huge ? "out of range" : "of NaN or inf";
    if (it->w.scale.data)
        snprintf(hint, sizeof hint, "a damaged file, or a scale %s in its scale companion '%s_scale_inv'", scale,
                 it->name);
    else if (eb_dtype_quantized(it->w.dtype))
        snprintf(hint, sizeof hint, "a damaged file, or a block scale %s", scale);
    else
        snprintf(hint, sizeof hint, "a damaged file");
    return eb_fail(EB_ERR_FORMAT, "'%s': tensor '%s' holds %s at %s (%s); --no-check-weights (check_weights=False) "
                                  "loads it anyway", m->files[it->file].path, it->name, what, at, hint);
}

int eb_check_weights(const eb_model *m, const eb_weight_checks *list) {
    int64_t n_parts = 0;
    for (int64_t i = 0; i < list->n; i++) {
        const eb_weight *w = &list->items[i].w;
        uint64_t row = eb_row_bytes(w->dtype, w->cols), per = row ? check_part / row : 1;
        per = per ? per : 1;
        n_parts += (w->rows + (int64_t)per - 1) / (int64_t)per;
    }
    check_job j = {list, NULL, n_parts, 0, n_parts};
    if (n_parts == 0) return EB_OK;
    if (!(j.parts = malloc((size_t)n_parts * sizeof *j.parts)))
        return eb_fail(EB_ERR_MEMORY, "out of memory for checking the weights");
    for (int64_t i = 0, k = 0; i < list->n; i++) {
        const eb_weight *w = &list->items[i].w;
        uint64_t row = eb_row_bytes(w->dtype, w->cols), per = row ? check_part / row : 1;
        per = per ? per : 1;
        for (int64_t r = 0; r < w->rows; r += (int64_t)per)
            j.parts[k++] = (check_part_t){i, r, r + (int64_t)per < w->rows ? r + (int64_t)per : w->rows, -1, -1, 0};
    }
    pthread_t threads[MAX_CHECK_THREADS];
    int n = check_threads(n_parts), started = 1;
    for (; started < n; started++)
        if (pthread_create(&threads[started], NULL, check_parts, &j) != 0) break;
    check_parts(&j); /* the calling thread takes parts too, and all of them if no thread started */
    for (int i = 1; i < started; i++) pthread_join(threads[i], NULL);
    check_threads_used = started;
    int64_t bad = atomic_load(&j.first_bad);
    int st = bad < n_parts ? report(m, &list->items[j.parts[bad].item], &j.parts[bad]) : EB_OK;
    free(j.parts);
    return st;
}
