/* Internal structures of the core, shared by its translation units. */
#ifndef EB_INTERNAL_H
#define EB_INTERNAL_H

#include <stdarg.h>

#include "eb_runtime.h"
#include "expertbench.h"

#define EB_MAX_RUNTIMES 8
#define EB_MAX_DEVICES 64

typedef struct {
    const eb_runtime_table *table;
    void *rt;
    void *dl;
    char name[EB_MAX_NAME];
    char path[EB_MAX_PATH];
    int first_device; /* engine-wide index of its device 0 */
    int n_devices;
} eb_runtime;

typedef struct {
    int runtime;      /* index into engine->runtimes */
    int local;        /* device index inside its runtime */
    int host_addressable;
    int queued_ops; /* its forward operations return before they have run (a GPU) */
    uint32_t formats; /* the weight formats its kernels read (1 << dtype) */
    uint32_t precisions; /* the activation precisions its kernels run (1 << eb_precision) */
    uint32_t q8_formats; /* of formats, those it runs in the q8 precision as the cpu module does */
    uint32_t kv_formats; /* the KV cache formats its attention keeps besides f32 (eb_rt_device_info) */
    char name[EB_MAX_NAME];
} eb_device;

struct eb_engine {
    eb_runtime runtimes[EB_MAX_RUNTIMES];
    int n_runtimes;
    eb_device devices[EB_MAX_DEVICES];
    int n_devices;
    int n_models;          /* models alive; the engine outlives them */
    int destroy_requested; /* eb_engine_destroy was called while models were alive: done when the last goes */
    /* modules that loaded but found no device: kept mapped until the engine goes, so runtimes that load
     * side by side are really side by side in the process */
    void *idle_dl[EB_MAX_RUNTIMES];
    int n_idle;
};

/* The host's CLOCK_MONOTONIC in nanoseconds (the trace's clock). */
uint64_t eb_now_ns(void);

/* Copy a string, truncating to fit size (always NUL-terminated). */
void eb_copy_str(char *dst, size_t size, const char *src);

/* Free the engine now (eb_engine_destroy defers to this when no model is alive). */
void eb_engine_release(eb_engine *engine);

/* Set the calling thread's last error and return status. */
int eb_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* How a model's files will be held (*mode: EB_WEIGHTS_MAP or EB_WEIGHTS_COPY) for a requested eb_weights_mode,
 * the files' size, the memory available (0: unknown) and whether huge pages can back advised memory. */
int eb_weights_choose(int requested, uint64_t file_bytes, uint64_t available, int huge_pages, int *mode);
/* The least a thread reads of a file being copied (default 64 MiB; 0 restores it), its parts in whole 2 MiB pages
 * or, where this is smaller, in units of it: tests make it small so that their small files are read by several
 * threads. */
void eb_set_copy_min_part(uint64_t bytes);
/* How many threads read the last file copied. */
int eb_copy_threads_used(void);
/* The most bytes of weights one part of the load's finiteness check reads (default 8 MiB; 0 restores it: tests make
 * it small so that their small weights are checked in many parts by several threads), and how many threads the last
 * check ran on. */
void eb_set_check_part(uint64_t bytes);
int eb_check_threads_used(void);

static inline const eb_runtime *eb_device_runtime(const eb_engine *e, int device) {
    return &e->runtimes[e->devices[device].runtime];
}

#endif
