/* pycollector_heap: samples a Python program's heap allocations for an eBPF profiler, through the
 * OpenTelemetry memory-profiling USDT contract, as the native sampler (sdk/native) does for the
 * malloc family: the same probes, semaphores, sampling and settings, from the same header
 * (heap_sampling.h, reached through the `native` link beside setup.py).
 *
 * What it wraps: CPython's three allocator domains, as tracemalloc hooks them: for each, the
 * allocator in place is kept (PyMem_GetAllocator) and ours installed (PyMem_SetAllocator), which
 * calls it for every request and accounts what it returned. Sampling at this level sees every
 * Python object, pymalloc's small ones included (their arenas are mmap()ed: a malloc wrapper never
 * sees them), at the size the interpreter asked for; the profiler's Python walker names the
 * function that asked.
 *
 * When: RAW at start(), MEM and OBJ once a profiler first listens. A hook in MEM and OBJ, however
 * small, costs each object's allocation and free a call: CPython's build (PGO) inlines pymalloc
 * where PyObject_Malloc calls it, and calls a hook through the pointer (+2 ns a call on the
 * development VM, 5-10% of a json round trip). RAW takes what pymalloc passes on (requests over 512
 * bytes) and the interpreter's own buffers: its hook, a load and a jump with no profiler, sees the
 * semaphore raised at the first such request after a profiler attached, and has the main thread
 * hook MEM and OBJ (a pending call: it may run without the GIL, inside pymalloc). Hooked, they stay
 * hooked for good. So a program pays next to nothing until a profiler listens, and its first
 * samples come with its first RAW allocation after that.
 *
 * Nesting: pymalloc serves requests over 512 bytes with PyMem_RawMalloc, which is our RAW hook
 * again. The outermost call of a thread is the one accounted (self.busy while we call through),
 * so a large object is one sample at its size, not two.
 *
 * Threads: RAW may be called without the GIL, from any thread. The sampling state is per thread,
 * the set of sampled blocks lock-free to read and locked to write (sampled_set.h); nothing here
 * takes the GIL or calls back into Python. Our hooks ignore the ctx they are given and read their
 * domain's allocator themselves, and are installed with the ctx of the allocator they wrap: a
 * thread that reads the domain's (ctx, function) pair while PyMem_SetAllocator writes it gets a
 * working pair, old or new, whichever half it read first.
 *
 * Started once, by start() (the package's pycollector_heap.pth calls it at interpreter start-up
 * when PYCOLLECTOR_HEAP_SAMPLE_BYTES is set), and never stopped: blocks allocated before it are
 * freed through it (not sampled: their free fires nothing), and a hook removed would leave sampled
 * blocks whose free no one reports. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <link.h>
#include <stdint.h>
#include <string.h>

/* Initial-exec TLS, though this module is dlopen()ed: its 24 bytes come from the static TLS
 * surplus glibc keeps for such modules (and which this module, imported by site before others,
 * finds free), and every access is one instruction. Through TLS descriptors (gnu2, _native.c's)
 * each access was a call, and the attached hooks cost about twice as much (bytes(100) created and
 * freed: +16 ns against +8 ns, on the development VM). Should the surplus be gone, the import
 * fails and the program runs unsampled. */
#define HEAP_TLS __thread __attribute__((tls_model("initial-exec")))
#define HEAP_SAMPLER_NAME "pycollector_heap"
#include "heap_sampling.h"

struct domain {
    PyMemAllocatorDomain id;
    const char *name;      /* the test trace's caller */
    PyMemAllocatorEx next; /* the allocator we wrap */
};

static struct domain raw = {PYMEM_DOMAIN_RAW, "raw", {0}};
static struct domain mem = {PYMEM_DOMAIN_MEM, "mem", {0}};
static struct domain obj = {PYMEM_DOMAIN_OBJ, "obj", {0}};

/* The trace names the domain; the profiler names the Python function from its stack. */
static char *put_caller(char *out, const void *caller) { return put_str(out, (const char *)caller); }

/* With a profiler attached: `call` (the domain's allocator) and the accounting of `size` bytes,
 * unless this thread is within one of our hooks already (pymalloc passing a large request on to
 * PyMem_RawMalloc): one TLS flag set and cleared around the call, a compare and a subtract. */
#define CALL_ACCOUNTED(d, call, size)    \
    struct thread_state *t = &self;      \
    if (t->busy) return (call);          \
    t->busy = 1;                         \
    void *p = (call);                    \
    t->busy = 0;                         \
    ACCOUNT_IN(t, p, (size), (d)->name); \
    return p

/* Whether a profiler listens: its semaphore raised. RAW, hooked from the start, also sees that
 * MEM and OBJ are hooked, or has them hooked (ask_for_object_domains, below). */
static void ask_for_object_domains(void);
static _Atomic int object_domains; /* enum hooking; MEM and OBJ are hooked together */
enum hooking { NOT_HOOKED, ASKED, HOOKING, HOOKED };
#define LISTENING(d) (ALLOC_ENABLED() && ((d) != &raw || LIKELY(object_domains == HOOKED) || (ask_for_object_domains(), 1)))

/* With no profiler attached, each hook is a load of the semaphore and a tail call. A free looks
 * for its pointer among the sampled blocks only while one is alive; realloc is the free of the old
 * block (told before the allocator may hand its address to another thread) and an allocation of
 * `n` bytes, sampled like any other: realloc(NULL, n) is an allocation only, realloc(p, 0) the
 * domain's (CPython's give a block back). Should realloc fail, the old block lives on unsampled. */

static inline __attribute__((always_inline)) void *hook_malloc(struct domain *d, size_t n) {
    if (!LISTENING(d)) return d->next.malloc(d->next.ctx, n);
    CALL_ACCOUNTED(d, d->next.malloc(d->next.ctx, n), n);
}

static inline __attribute__((always_inline)) void *hook_calloc(struct domain *d, size_t count, size_t elsize) {
    if (!LISTENING(d)) return d->next.calloc(d->next.ctx, count, elsize);
    size_t size;
    if (__builtin_mul_overflow(count, elsize, &size)) size = 0; /* (refused: NULL, nothing allocated) */
    CALL_ACCOUNTED(d, d->next.calloc(d->next.ctx, count, elsize), size);
}

static inline __attribute__((always_inline)) void *hook_realloc(struct domain *d, void *ptr, size_t n) {
    untrack(ptr);
    if (!LISTENING(d)) return d->next.realloc(d->next.ctx, ptr, n);
    CALL_ACCOUNTED(d, d->next.realloc(d->next.ctx, ptr, n), n);
}

static inline __attribute__((always_inline)) void hook_free(struct domain *d, void *ptr) {
    untrack(ptr);
    d->next.free(d->next.ctx, ptr);
}

/* One set of entry points per domain, each bound to its domain at compile time (not through ctx). */
#define HOOKS(D)                                                                                               \
    static void *D##_malloc(void *ctx, size_t n) { (void)ctx; return hook_malloc(&D, n); }                     \
    static void *D##_calloc(void *ctx, size_t c, size_t e) { (void)ctx; return hook_calloc(&D, c, e); }        \
    static void *D##_realloc(void *ctx, void *p, size_t n) { (void)ctx; return hook_realloc(&D, p, n); }       \
    static void D##_free(void *ctx, void *p) { (void)ctx; hook_free(&D, p); }                                  \
    static void install_##D(void) { /* the domain's allocator now wrapped: ours on top of it */                \
        PyMem_GetAllocator(D.id, &D.next);                                                                     \
        PyMemAllocatorEx ours = {D.next.ctx, D##_malloc, D##_calloc, D##_realloc, D##_free};                    \
        PyMem_SetAllocator(D.id, &ours);                                                                       \
    }
HOOKS(raw)
HOOKS(mem)
HOOKS(obj)

/* With the GIL (a GIL handed over orders memory, so every thread that calls MEM or OBJ after this
 * finds the allocators we wrap): MEM and OBJ hooked, by one thread only (a second would wrap our
 * own hooks). Also a pending call. */
static int hook_object_domains(void *unused) {
    (void)unused;
    int now = object_domains;
    while (now == NOT_HOOKED || now == ASKED) {
        if (atomic_compare_exchange_weak(&object_domains, &now, HOOKING)) {
            install_mem();
            install_obj();
            object_domains = HOOKED;
            break;
        }
    }
    return 0;
}

/* A profiler listens, and MEM and OBJ are not hooked yet. A thread holding the GIL hooks them now
 * (inside pymalloc maybe: PyMem_SetAllocator allocates nothing); one without asks the main thread
 * to, by a pending call (Py_AddPendingCall needs no GIL nor thread state, allocates nothing), once,
 * and meanwhile its RAW requests are sampled. (The main thread runs pending calls between two
 * bytecodes: one blocked for good in C leaves it to the next RAW request made with the GIL.) */
static void __attribute__((noinline, cold)) ask_for_object_domains(void) {
    if (PyGILState_Check()) {
        hook_object_domains(NULL);
        return;
    }
    int expected = NOT_HOOKED;
    if (atomic_compare_exchange_strong(&object_domains, &expected, ASKED) && Py_AddPendingCall(hook_object_domains, NULL) != 0) {
        expected = ASKED;
        atomic_compare_exchange_strong(&object_domains, &expected, NOT_HOOKED); /* (its queue full: asked again later) */
    }
}

/* A child forked while the call was queued may not run it: it asks again (hooking is done once,
 * whoever comes first). */
static void after_fork_in_child(void) {
    int expected = ASKED;
    atomic_compare_exchange_strong(&object_domains, &expected, NOT_HOOKED);
}

/* The native sampler preloaded (LD_PRELOAD=libpycollector_heap.so) samples what reaches malloc,
 * Python's large objects among it: both at once would count those twice. Found by its file name
 * among the objects loaded (dlsym(RTLD_DEFAULT, "malloc") would name a non-PIE python's PLT). */
static int is_native_sampler(struct dl_phdr_info *info, size_t size, void *unused) {
    (void)size, (void)unused;
    const char *name = info->dlpi_name ? info->dlpi_name : "", *slash = strrchr(name, '/');
    return strcmp(slash ? slash + 1 : name, "libpycollector_heap.so") == 0;
}

static int native_sampler_loaded(void) { return dl_iterate_phdr(is_native_sampler, NULL); }

enum state { OFF, ON, NATIVE_LOADED };
static enum state state = OFF; /* changed under the GIL only */
static const char *const STATE_NAMES[] = {"off", "on", "native sampler loaded"};

static PyObject *start(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    if (state != OFF) Py_RETURN_FALSE;
    if (native_sampler_loaded()) {
        state = NATIVE_LOADED;
        Py_RETURN_FALSE;
    }
    int saved_errno = errno;
    heap_sampling_configure();
    pthread_atfork(NULL, NULL, after_fork_in_child);
    install_raw();
    if (ALLOC_ENABLED()) hook_object_domains(NULL); /* (the test trace: a profiler listens from the start) */
    state = ON;
    errno = saved_errno;
    Py_RETURN_TRUE;
}

static PyObject *stats(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return Py_BuildValue("{s:s,s:s,s:K,s:K,s:K,s:K,s:n}", "state", STATE_NAMES[state],
                         "hooked", state != ON ? "" : object_domains == HOOKED ? "raw mem obj" : "raw",
                         "interval", (unsigned long long)interval,
                         "samples", (unsigned long long)atomic_load_explicit(&fired.allocs, memory_order_relaxed),
                         "sampled_bytes", (unsigned long long)atomic_load_explicit(&fired.bytes, memory_order_relaxed),
                         "frees", (unsigned long long)atomic_load_explicit(&fired.frees, memory_order_relaxed),
                         "live", (Py_ssize_t)sampled_count());
}

static PyMethodDef methods[] = {
    {"start", start, METH_NOARGS,
     "start() -> bool\n\nSample CPython's RAW, MEM and OBJ allocator domains (mean interval: PYCOLLECTOR_HEAP_SAMPLE_BYTES, "
     "default 524288): RAW hooked now, MEM and OBJ once a profiler listens. True when it started now; False when it was on already, "
     "or the native sampler (libpycollector_heap.so) is preloaded and samples this process instead. "
     "Allocations made before it are not sampled."},
    {"stats", stats, METH_NOARGS,
     "stats() -> dict\n\nstate ('off', 'on', 'native sampler loaded'), hooked (the domains: 'raw' until a profiler "
     "first listens, then 'raw mem obj'), interval, and since start: samples "
     "(otel_memory:alloc fired), sampled_bytes (their weights: the estimate of the bytes allocated while a "
     "profiler listened), frees (otel_memory:free fired), live (sampled blocks remembered, not freed yet)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pycollector_heap",
    "Samples this process's Python heap for eBPF profilers (OpenTelemetry's otel_memory USDT probes).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_pycollector_heap(void) { return PyModule_Create(&module); }
