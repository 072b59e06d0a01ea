/* Weight files memory-mapped while the model runs, guarded against being truncated or rewritten underneath it.
 *
 * A file cut short while mapped (a model re-downloaded over the old one, a disk that filled during a copy) makes
 * the next read of a page past its new end raise SIGBUS, which kills the process. Each mapping is registered here;
 * a SIGBUS handler that finds the faulting address inside one maps zero pages over the rest of that mapping, marks
 * the file changed and returns, so the step finishes on zeros and the core then refuses it and every later step
 * with the file's name. A fault anywhere else goes to the handler that was there before (the default: the process
 * dies as it would have). Between steps the file's size and modification time are compared with those at load, so
 * a rewrite that raises no fault is caught too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eb_model.h"

/* The handler reads the table without a lock: each slot is published by its `end` last and withdrawn by it first. */
enum { MAX_MAPPINGS = 4096 };
typedef struct {
    _Atomic uintptr_t start, end; /* end == 0: a free slot */
    _Atomic(_Atomic int *) changed;
    _Atomic int index; /* the file's index in its model, reported through *changed as index + 1 */
} mapping_slot;

static mapping_slot slots[MAX_MAPPINGS];
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t handler_once = PTHREAD_ONCE_INIT;
static struct sigaction previous;
static int handler_installed;

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    uintptr_t addr = (uintptr_t)info->si_addr;
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        uintptr_t end = atomic_load(&slots[i].end), start = atomic_load(&slots[i].start);
        if (!end || addr < start || addr >= end) continue;
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), from = addr & ~(page - 1);
        /* zeros from the faulting page to the end of the mapping (munmap of the whole mapping frees them too) */
        if (mmap((void *)from, end - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            break;
        _Atomic int *changed = atomic_load(&slots[i].changed);
        if (changed) atomic_store(changed, atomic_load(&slots[i].index) + 1);
        return;
    }
    /* not a weight mapping: what would have happened without this handler */
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, uctx);
    } else if (previous.sa_handler == SIG_IGN) {
        return;
    } else if (previous.sa_handler != SIG_DFL) {
        previous.sa_handler(sig);
    } else {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

static void install_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    handler_installed = sigaction(SIGBUS, &sa, &previous) == 0;
}

int eb_mapping_register(eb_model *m, int index) {
    eb_mapped_file *f = &m->files[index];
    pthread_once(&handler_once, install_handler);
    if (!handler_installed) return EB_OK; /* no guard (the file is still mapped): as before this existed */
    pthread_mutex_lock(&slots_mu);
    int slot = -1;
    for (int i = 0; i < MAX_MAPPINGS && slot < 0; i++)
        if (!atomic_load(&slots[i].end)) slot = i;
    if (slot >= 0) {
        atomic_store(&slots[slot].start, (uintptr_t)f->addr);
        atomic_store(&slots[slot].changed, &m->changed_file);
        atomic_store(&slots[slot].index, index);
        atomic_store(&slots[slot].end, (uintptr_t)f->addr + f->map_bytes);
    }
    pthread_mutex_unlock(&slots_mu);
    f->slot = slot;
    if (slot < 0) /* an unguarded mapping would let a truncation kill the process: refused instead */
        return eb_fail(EB_ERR_IO,
                       "cannot map '%s': %d weight files are memory-mapped already (every model loaded in this "
                       "process counts), the most whose truncation the engine can guard against; close a model, or "
                       "load this one with weights 'copy'",
                       f->path, MAX_MAPPINGS);
    return EB_OK;
}

void eb_mapping_unregister(eb_mapped_file *f) {
    if (f->slot < 0) return;
    pthread_mutex_lock(&slots_mu);
    atomic_store(&slots[f->slot].end, 0);
    atomic_store(&slots[f->slot].changed, NULL);
    pthread_mutex_unlock(&slots_mu);
    f->slot = -1;
}

int eb_model_file_faulted(const eb_model *m) {
    int changed = atomic_load(&m->changed_file);
    if (!changed) return EB_OK;
    return eb_fail(EB_ERR_IO, "'%s' changed while the model held it memory-mapped (truncated or rewritten): its "
                              "weights can no longer be trusted; load the model again", m->files[changed - 1].path);
}

int eb_model_check_files(eb_model *m) {
    for (int i = 0; i < m->n_files && !atomic_load(&m->changed_file); i++) {
        eb_mapped_file *f = &m->files[i];
        struct stat sb;
        if (f->fd < 0) continue; /* copied at load: what happens to the file no longer matters */
        if (fstat(f->fd, &sb) != 0 || (uint64_t)sb.st_size != f->size || sb.st_mtim.tv_sec != f->mtime.tv_sec ||
            sb.st_mtim.tv_nsec != f->mtime.tv_nsec)
            atomic_store(&m->changed_file, i + 1);
    }
    return eb_model_file_faulted(m);
}
