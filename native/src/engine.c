/* Errors, the engine object, and loading of runtime modules. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "eb_internal.h"

static _Thread_local char last_error[1024];

int eb_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *eb_last_error(void) { return last_error; }

void eb_copy_str(char *dst, size_t size, const char *src) {
    if (!size) return;
    size_t n = strlen(src);
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

const char *eb_status_name(int status) {
    switch (status) {
    case EB_OK: return "ok";
    case EB_ERR_ARGUMENT: return "argument";
    case EB_ERR_IO: return "io";
    case EB_ERR_FORMAT: return "format";
    case EB_ERR_UNSUPPORTED: return "unsupported";
    case EB_ERR_RANGE: return "range";
    case EB_ERR_MODULE: return "module";
    case EB_ERR_MEMORY: return "memory";
    case EB_ERR_DEVICE: return "device";
    case EB_ERR_STATE: return "state";
    case EB_ERR_NUMERIC: return "numeric";
    default: return "unknown";
    }
}

uint32_t eb_runtime_abi_version(void) { return EB_RUNTIME_ABI_VERSION; }

/* The first entry a module's table lacks, by group (a capability group is absent or complete), or NULL. */
static const char *table_missing(const eb_runtime_table *t) {
    if (t->table_size < sizeof(eb_runtime_table)) return "the table is smaller than this core's";
    if (!t->name || !t->init || !t->shutdown || !t->kernel_variant || !t->device_count || !t->device_info ||
        !t->busy_ns)
        return "identity and devices";
    if (!t->mem_alloc || !t->mem_free || !t->host_alloc || !t->host_free || !t->copy_to_device || !t->copy_to_host ||
        !t->synchronize)
        return "memory and copies";
    if (!t->event_create || !t->event_destroy || !t->event_record || !t->event_wait || !t->event_time)
        return "events";
    if (!t->expert_ffn) return "expert_ffn";
    const eb_rt_forward_ops *f = t->forward;
    if (f && (!f->check_model || !f->embed || !f->matmul || !f->add || !f->silu_mul || !f->attention || !f->route ||
              !f->moe))
        return "the forward group is incomplete";
    const eb_rt_graph_ops *g = t->graphs;
    if (g && (!g->begin || !g->end || !g->launch || !g->free)) return "the graphs group is incomplete";
    if (g && !f) return "graphs without the forward group";
    return NULL;
}

int eb_engine_create(eb_engine **out) {
    if (!out) return eb_fail(EB_ERR_ARGUMENT, "eb_engine_create: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out) return eb_fail(EB_ERR_MEMORY, "eb_engine_create: out of memory");
    return EB_OK;
}

void eb_engine_destroy(eb_engine *engine) {
    if (!engine) return;
    if (engine->n_models > 0) { /* the models still use its runtimes: the last one to go frees the engine */
        engine->destroy_requested = 1;
        return;
    }
    eb_engine_release(engine);
}

void eb_engine_release(eb_engine *engine) {
    for (int i = engine->n_runtimes - 1; i >= 0; i--) {
        eb_runtime *r = &engine->runtimes[i];
        if (r->table && r->rt) r->table->shutdown(r->rt);
        if (r->dl) dlclose(r->dl);
    }
    for (int i = 0; i < engine->n_idle; i++) dlclose(engine->idle_dl[i]);
    free(engine);
}

int eb_core_location(char *buf, size_t len) {
    Dl_info info;
    if (!buf || len == 0) return eb_fail(EB_ERR_ARGUMENT, "eb_core_location: no buffer");
    if (dladdr((void *)&eb_core_location, &info) == 0 || !info.dli_fname)
        return eb_fail(EB_ERR_MODULE, "could not find the core library's own file (dladdr failed)");
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return eb_fail(EB_ERR_MODULE, "the core library's path '%s' has no folder", info.dli_fname);
    size_t n = (size_t)(slash - info.dli_fname);
    if (n + 1 > len) return eb_fail(EB_ERR_ARGUMENT, "eb_core_location: buffer too small");
    memcpy(buf, info.dli_fname, n);
    buf[n] = 0;
    return EB_OK;
}

static int valid_runtime_name(const char *name) {
    if (!name || !*name || strlen(name) >= 32) return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) return 0;
    return 1;
}

int eb_engine_load_runtime(eb_engine *engine, const char *name, const char *path, const eb_runtime_options *options) {
    if (!engine) return eb_fail(EB_ERR_ARGUMENT, "load runtime: engine is NULL");
    if (!valid_runtime_name(name))
        return eb_fail(EB_ERR_ARGUMENT, "load runtime: name '%s' is not a runtime name (expected lowercase letters, "
                                        "digits, '_', e.g. 'cpu')", name ? name : "(null)");
    for (int i = 0; i < engine->n_runtimes; i++)
        if (strcmp(engine->runtimes[i].name, name) == 0)
            return eb_fail(EB_ERR_STATE, "runtime '%s' is already loaded", name);
    if (engine->n_runtimes >= EB_MAX_RUNTIMES)
        return eb_fail(EB_ERR_STATE, "load runtime '%s': at most %d runtimes", name, EB_MAX_RUNTIMES);

    char file[EB_MAX_PATH];
    if (path) {
        if (strlen(path) + 3 >= EB_MAX_PATH)
            return eb_fail(EB_ERR_ARGUMENT, "runtime module path is longer than %d bytes", EB_MAX_PATH - 3);
        /* dlopen searches the library path for a name without '/': an explicit path must name a file. */
        if (!strchr(path, '/')) {
            memcpy(file, "./", 2);
            eb_copy_str(file + 2, sizeof file - 2, path);
        } else {
            eb_copy_str(file, sizeof file, path);
        }
    } else {
        char dir[EB_MAX_PATH];
        int st = eb_core_location(dir, sizeof dir - 64);
        if (st) return st;
        snprintf(file, sizeof file, "%.900s/expertbench_rt_%.31s.so", dir, name);
    }
    struct stat sb;
    if (stat(file, &sb) != 0)
        return eb_fail(EB_ERR_MODULE, "runtime module '%s': file '%s' does not exist", name, file);
    if (!S_ISREG(sb.st_mode))
        return eb_fail(EB_ERR_MODULE, "runtime module '%s': '%s' is not a regular file (expected a shared library)",
                       name, file);
    void *dl = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        return eb_fail(EB_ERR_MODULE, "runtime module '%s': could not load '%s': %s", name, file, why ? why : "?");
    }
    eb_runtime_entry_fn entry;
    void *sym = dlsym(dl, EB_RUNTIME_ENTRY);
    if (!sym) {
        dlclose(dl);
        return eb_fail(EB_ERR_MODULE, "runtime module '%s' ('%s') does not export %s", name, file, EB_RUNTIME_ENTRY);
    }
    memcpy(&entry, &sym, sizeof entry);
    const eb_runtime_table *t = entry();
    if (!t) {
        dlclose(dl);
        return eb_fail(EB_ERR_MODULE, "runtime module '%s' ('%s') returned no table", name, file);
    }
    if (t->abi_version != EB_RUNTIME_ABI_VERSION) {
        unsigned got = t->abi_version;
        dlclose(dl);
        return eb_fail(EB_ERR_MODULE, "runtime module '%s' ('%s') has ABI version %u, expected %u", name, file, got,
                       EB_RUNTIME_ABI_VERSION);
    }
    const char *missing = table_missing(t);
    if (missing) {
        dlclose(dl);
        return eb_fail(EB_ERR_MODULE, "runtime module '%s' ('%s') has an incomplete function table: %s", name, file,
                       missing);
    }
    if (strcmp(t->name, name) != 0) {
        char got[EB_MAX_NAME];
        snprintf(got, sizeof got, "%s", t->name);
        dlclose(dl);
        return eb_fail(EB_ERR_MODULE, "runtime module '%s' ('%s') identifies itself as '%s'", name, file, got);
    }
    char err[512] = "";
    void *rt = NULL;
    int st = t->init(options, &rt, err, sizeof err);
    int nd = st ? 0 : t->device_count(rt);
    if (st || nd <= 0) {
        if (!st) t->shutdown(rt);
        if (engine->n_idle < EB_MAX_RUNTIMES) engine->idle_dl[engine->n_idle++] = dl;
        else dlclose(dl);
        if (st) return eb_fail(st, "runtime module '%s': %s", name, err);
        return eb_fail(EB_ERR_DEVICE, "runtime module '%s' found no device", name);
    }
    if (engine->n_devices + nd > EB_MAX_DEVICES) {
        t->shutdown(rt);
        dlclose(dl);
        return eb_fail(EB_ERR_STATE, "runtime module '%s': more than %d devices in all", name, EB_MAX_DEVICES);
    }
    eb_runtime *r = &engine->runtimes[engine->n_runtimes];
    memset(r, 0, sizeof *r);
    r->table = t;
    r->rt = rt;
    r->dl = dl;
    snprintf(r->name, sizeof r->name, "%s", name);
    eb_copy_str(r->path, sizeof r->path, file);
    r->first_device = engine->n_devices;
    r->n_devices = nd;
    for (int i = 0; i < nd; i++) {
        eb_rt_device_info info;
        if ((st = t->device_info(rt, i, &info, err, sizeof err)) != 0) {
            t->shutdown(rt);
            dlclose(dl);
            return eb_fail(st, "runtime module '%s', device %d: %s", name, i, err);
        }
        eb_device *d = &engine->devices[engine->n_devices + i];
        d->runtime = engine->n_runtimes;
        d->local = i;
        d->host_addressable = info.host_addressable;
        d->queued_ops = info.queued_ops;
        d->formats = info.formats;
        d->precisions = info.precisions;
        d->q8_formats = info.q8_formats;
        d->kv_formats = info.kv_formats & (1u << EB_DTYPE_F16 | 1u << EB_DTYPE_BF16);
        snprintf(d->name, sizeof d->name, "%s:%d", name, i);
    }
    engine->n_devices += nd;
    engine->n_runtimes++;
    return EB_OK;
}

int eb_engine_runtime_count(const eb_engine *engine) { return engine ? engine->n_runtimes : 0; }

int eb_engine_runtime_info(const eb_engine *engine, int index, eb_runtime_info *out) {
    if (!engine || !out) return eb_fail(EB_ERR_ARGUMENT, "runtime info: NULL argument");
    if (index < 0 || index >= engine->n_runtimes)
        return eb_fail(EB_ERR_RANGE, "runtime index %d out of range (%d loaded)", index, engine->n_runtimes);
    const eb_runtime *r = &engine->runtimes[index];
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", r->name);
    eb_copy_str(out->path, sizeof out->path, r->path);
    snprintf(out->kernel_variant, sizeof out->kernel_variant, "%s", r->table->kernel_variant(r->rt));
    out->abi_version = r->table->abi_version;
    out->n_devices = r->n_devices;
    size_t at = 0;
    for (const eb_rt_extension *e = r->table->extensions; e && e->id.name; e++) {
        int w = snprintf(out->extensions + at, sizeof out->extensions - at, "%s%s/%u", at ? "," : "", e->id.name,
                         (unsigned)e->id.version);
        if (w < 0 || (size_t)w >= sizeof out->extensions - at) { /* more than fits: the list ends with "..." */
            memcpy(out->extensions + sizeof out->extensions - 4, "...", 4);
            break;
        }
        at += (size_t)w;
    }
    return EB_OK;
}

int eb_engine_device_count(const eb_engine *engine) { return engine ? engine->n_devices : 0; }

int eb_engine_device_info(const eb_engine *engine, int index, eb_device_info *out) {
    if (!engine || !out) return eb_fail(EB_ERR_ARGUMENT, "device info: NULL argument");
    if (index < 0 || index >= engine->n_devices)
        return eb_fail(EB_ERR_RANGE, "device index %d out of range (%d devices)", index, engine->n_devices);
    const eb_device *d = &engine->devices[index];
    const eb_runtime *r = &engine->runtimes[d->runtime];
    eb_rt_device_info info;
    char err[512] = "";
    int st = r->table->device_info(r->rt, d->local, &info, err, sizeof err);
    if (st) return eb_fail(st, "device %s: %s", d->name, err);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", d->name);
    snprintf(out->kind, sizeof out->kind, "%s", info.kind);
    snprintf(out->description, sizeof out->description, "%s", info.name);
    out->memory_total = info.memory_total;
    out->memory_free = info.memory_free;
    out->runtime_index = d->runtime;
    out->local_index = d->local;
    out->threads = info.threads;
    out->formats = info.formats;
    out->precisions = info.precisions;
    out->kv_caches = 1u << EB_DTYPE_F32 | d->kv_formats;
    out->queued_ops = d->queued_ops;
    return EB_OK;
}

int eb_engine_find_device(const eb_engine *engine, const char *name, int32_t *index) {
    if (!engine || !name || !index) return eb_fail(EB_ERR_ARGUMENT, "find device: NULL argument");
    for (int i = 0; i < engine->n_devices; i++)
        if (strcmp(engine->devices[i].name, name) == 0) {
            *index = i;
            return EB_OK;
        }
    return eb_fail(EB_ERR_RANGE, "no device named '%s' (%d devices loaded)", name, engine->n_devices);
}

