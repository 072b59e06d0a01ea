/* The runtime-module ABI: what a module (cpu, cuda, hip) exports and the core calls.
 *
 * A module is a shared library loaded with dlopen(RTLD_NOW | RTLD_LOCAL). It exports exactly one symbol,
 * EB_RUNTIME_ENTRY, a function returning a pointer to a const table. The core checks abi_version and
 * table_size before using anything else in it. Every function returns 0 on success or an eb_status, with
 * a message written into err (errlen bytes, always NUL-terminated).
 */
#ifndef EB_RUNTIME_H
#define EB_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "expertbench.h"

#define EB_RUNTIME_ABI_VERSION 1u
#define EB_RUNTIME_ENTRY "eb_runtime_module"

#if defined(__GNUC__)
#define EB_EXPORT __attribute__((visibility("default")))
#else
#define EB_EXPORT
#endif

typedef struct {
    char name[EB_MAX_NAME];        /* local name, e.g. "EPYC 7B13 (2 threads)" */
    char kind[EB_MAX_NAME];        /* "cpu" or "gpu" */
    uint64_t memory_total;
    uint64_t memory_free;
    int32_t threads;
    int32_t host_addressable;      /* 1: device memory is ordinary host memory (weights can stay mapped) */
} eb_rt_device_info;

typedef struct eb_runtime_table {
    uint32_t abi_version;          /* EB_RUNTIME_ABI_VERSION */
    uint32_t table_size;           /* sizeof(eb_runtime_table) as the module was built */
    const char *name;              /* "cpu" */

    int (*init)(const eb_runtime_options *options, void **rt, char *err, size_t errlen);
    void (*shutdown)(void *rt);
    const char *(*kernel_variant)(void *rt);

    int (*device_count)(void *rt);
    int (*device_info)(void *rt, int dev, eb_rt_device_info *info, char *err, size_t errlen);

    int (*mem_alloc)(void *rt, int dev, size_t bytes, void **ptr, char *err, size_t errlen);
    void (*mem_free)(void *rt, int dev, void *ptr);
    int (*copy_to_device)(void *rt, int dev, void *dst, const void *src, size_t bytes, char *err, size_t errlen);
    int (*copy_to_host)(void *rt, int dev, void *dst, const void *src, size_t bytes, char *err, size_t errlen);
    int (*synchronize)(void *rt, int dev, char *err, size_t errlen);

    /* y[t][r] = sum_c x[t][c] * w[r][c] for t < n, r < rows; w of dtype eb_dtype, x and y f32.
     * Each output element is computed with the same arithmetic whatever n is. */
    int (*matmul)(void *rt, int dev, const void *w, int dtype, int64_t rows, int64_t cols, const float *x,
                  int64_t n, float *y, char *err, size_t errlen);
} eb_runtime_table;

typedef const eb_runtime_table *(*eb_runtime_entry_fn)(void);

#endif
