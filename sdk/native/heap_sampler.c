/* libpycollector_heap.so: samples a program's heap allocations for an eBPF profiler, through the
 * OpenTelemetry memory-profiling USDT contract (opentelemetry-ebpf-profiler,
 * design-docs/00003-memory-profiling):
 *
 *   otel_memory:alloc(ptr, size, weight)  on a sampled allocation; weight = nsamples * interval,
 *                                          the unbiased estimate of the bytes it stands for
 *   otel_memory:free(ptr)                 on the free of a pointer that alloc was fired for
 *
 * Loaded with LD_PRELOAD, it wraps the malloc family and calls the next definition (libc's, or
 * whichever allocator comes after it). Nothing the program sees changes: the same pointers, sizes,
 * alignments, errno and malloc_usable_size.
 *
 * The probes, the sampling, the set of sampled blocks, the settings (PYCOLLECTOR_HEAP_SAMPLE_BYTES,
 * PYCOLLECTOR_HEAP_SAMPLE_TRACE) and fork handling are heap_sampling.h's, shared with the Python
 * sampler (sdk/python); this file is what wrapping the malloc family takes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

/* Initial-exec TLS: the general-dynamic model may allocate a thread's block on first touch, with
 * malloc, which is us. An LD_PRELOAD library is loaded at start-up, where static TLS is there. */
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define HEAP_TLS TLS
#define HEAP_SAMPLER_NAME "libpycollector_heap"
#include "heap_sampling.h"

#define PUBLIC __attribute__((visibility("default")))

/* ---- the next allocator ------------------------------------------------------------------- */

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void (*free_fn)(void *);
typedef int (*posix_memalign_fn)(void **, size_t, size_t);
typedef void *(*aligned_fn)(size_t, size_t);
typedef void *(*valloc_fn)(size_t);

static malloc_fn real_malloc;
static calloc_fn real_calloc;
static realloc_fn real_realloc;
static free_fn real_free;
static posix_memalign_fn real_posix_memalign;
static aligned_fn real_aligned_alloc;
static aligned_fn real_memalign;
static valloc_fn real_valloc;
static void (*real_free_sized)(void *, size_t);                 /* optional: glibc >= 2.41 */
static void (*real_free_aligned_sized)(void *, size_t, size_t); /* optional */

/* In dlsym: this thread's calloc is served from the start-up buffer. */
static TLS unsigned char resolving;

/* dlsym allocates (its error state, with calloc) before we know where calloc is: those few bytes
 * come from here, and free and realloc recognise them by address. */
static _Alignas(64) unsigned char startup_buffer[16384];
static atomic_size_t startup_used;

static int in_startup_buffer(const void *p) {
    return UNLIKELY((uintptr_t)p - (uintptr_t)startup_buffer < sizeof startup_buffer);
}

static void *startup_alloc(size_t size, size_t alignment) {
    if (alignment < 16) alignment = 16;
    /* 16 bytes in front of each block keep its size, for realloc's copy. */
    size_t need = ((size + 15) & ~(size_t)15) + alignment + 16;
    if (size > sizeof startup_buffer || alignment > 4096) goto full;
    size_t at = atomic_fetch_add(&startup_used, need);
    if (at + need > sizeof startup_buffer) goto full;
    uintptr_t user = ((uintptr_t)startup_buffer + at + 16 + alignment - 1) & ~(uintptr_t)(alignment - 1);
    ((size_t *)user)[-1] = size;
    return (void *)user; /* static storage: already zero, as calloc needs */
full:
    errno = ENOMEM;
    return NULL;
}

static void resolve(void) {
    resolving = 1;
    /* Each store is the same value whichever thread gets here first; malloc last, as the others
     * are only looked at once it is there. */
    __atomic_store_n(&real_calloc, (calloc_fn)dlsym(RTLD_NEXT, "calloc"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_realloc, (realloc_fn)dlsym(RTLD_NEXT, "realloc"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_free, (free_fn)dlsym(RTLD_NEXT, "free"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_posix_memalign, (posix_memalign_fn)dlsym(RTLD_NEXT, "posix_memalign"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_aligned_alloc, (aligned_fn)dlsym(RTLD_NEXT, "aligned_alloc"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_memalign, (aligned_fn)dlsym(RTLD_NEXT, "memalign"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_valloc, (valloc_fn)dlsym(RTLD_NEXT, "valloc"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_free_sized, (void (*)(void *, size_t))dlsym(RTLD_NEXT, "free_sized"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_free_aligned_sized, (void (*)(void *, size_t, size_t))dlsym(RTLD_NEXT, "free_aligned_sized"), __ATOMIC_RELAXED);
    __atomic_store_n(&real_malloc, (malloc_fn)dlsym(RTLD_NEXT, "malloc"), __ATOMIC_RELEASE);
    resolving = 0;
    if (!real_malloc || !real_calloc || !real_realloc || !real_free || !real_posix_memalign || !real_memalign || !real_valloc) {
        static const char message[] = "libpycollector_heap: no next malloc family to wrap (dlsym RTLD_NEXT failed)\n";
        (void)!write(2, message, sizeof message - 1);
        abort();
    }
}

/* True when the caller is to be served from the start-up buffer: it is dlsym's own allocation. */
static int __attribute__((noinline, cold)) not_resolved(void) {
    if (resolving) return 1;
    resolve();
    return 0;
}
#define READY(fn) LIKELY(__atomic_load_n(&(fn), __ATOMIC_ACQUIRE) != NULL)

/* ---- the test trace's caller ------------------------------------------------------------ */

/* The symbol the wrapped call returns into (dladdr: an executable's own functions need -rdynamic),
 * else object+offset. */
static char *put_caller(char *out, const void *caller) {
    Dl_info info = {0};
    if (dladdr(caller, &info) && info.dli_sname && strlen(info.dli_sname) < 300) {
        out = put_str(out, info.dli_sname);
    } else if (info.dli_fname && strlen(info.dli_fname) < 300) {
        out = put_str(out, info.dli_fname);
        *out++ = '+';
        out = put_hex(out, (uintptr_t)caller - (uintptr_t)info.dli_fbase);
    } else {
        out = put_hex(out, (uintptr_t)caller);
    }
    return out;
}

/* With no profiler attached, each wrapper tail-calls the allocator after one load of the
 * semaphore; with one, ACCOUNT (heap_sampling.h) is a thread-local compare and subtract. */
#define CALLER __builtin_return_address(0)

/* ---- the wrappers --------------------------------------------------------------------- */

static void *__attribute__((noinline)) malloc_sampled(malloc_fn f, size_t size, void *caller) {
    void *p = f(size);
    ACCOUNT(p, size, caller);
    return p;
}

static void *__attribute__((noinline, cold)) malloc_unresolved(size_t size, void *caller) {
    if (not_resolved()) return startup_alloc(size, 16);
    return ALLOC_ENABLED() ? malloc_sampled(real_malloc, size, caller) : real_malloc(size);
}

/* malloc and free are the calls programs make most: each is loads, branches and a tail jump into
 * the allocator, no frame of its own, unless a profiler is attached (malloc) or a sampled block
 * is alive (free). */
PUBLIC void *malloc(size_t size) {
    malloc_fn f = __atomic_load_n(&real_malloc, __ATOMIC_ACQUIRE);
    if (UNLIKELY(!f)) return malloc_unresolved(size, CALLER);
    if (ALLOC_ENABLED()) return malloc_sampled(f, size, CALLER);
    return f(size);
}

PUBLIC void *calloc(size_t count, size_t size) {
    size_t total;
    if (!READY(real_malloc) && not_resolved()) {
        if (__builtin_mul_overflow(count, size, &total)) {
            errno = ENOMEM;
            return NULL;
        }
        return startup_alloc(total, 16);
    }
    if (!ALLOC_ENABLED()) return real_calloc(count, size);
    void *p = real_calloc(count, size);
    if (!__builtin_mul_overflow(count, size, &total)) ACCOUNT(p, total, CALLER);
    return p;
}

static void __attribute__((noinline, cold)) free_unresolved(void *ptr) {
    if (in_startup_buffer(ptr) || !ptr) return;
    if (!__atomic_load_n(&real_free, __ATOMIC_ACQUIRE)) {
        if (resolving) return; /* dlsym freeing what it did not get from us: left be */
        resolve(); /* freed before our first allocation: never ours */
    }
    untrack(ptr);
    real_free(ptr);
}

static void __attribute__((noinline)) free_looked_up(free_fn f, void *ptr) {
    untrack(ptr);
    f(ptr);
}

PUBLIC void free(void *ptr) {
    free_fn f = __atomic_load_n(&real_free, __ATOMIC_ACQUIRE);
    if (UNLIKELY(!f || in_startup_buffer(ptr))) {
        free_unresolved(ptr);
        return;
    }
    if (UNLIKELY(sampled_count() != 0)) {
        free_looked_up(f, ptr);
        return;
    }
    f(ptr);
}

/* C23's sized frees: libc's would free a sampled block without our free seeing it. */
PUBLIC void free_sized(void *ptr, size_t size) {
    if (in_startup_buffer(ptr)) return;
    if (UNLIKELY(!READY(real_malloc))) {
        if (!ptr) return;
        resolve();
    }
    untrack(ptr);
    if (real_free_sized) real_free_sized(ptr, size);
    else real_free(ptr);
}

PUBLIC void free_aligned_sized(void *ptr, size_t alignment, size_t size) {
    if (in_startup_buffer(ptr)) return;
    if (UNLIKELY(!READY(real_malloc))) {
        if (!ptr) return;
        resolve();
    }
    untrack(ptr);
    if (real_free_aligned_sized) real_free_aligned_sized(ptr, alignment, size);
    else real_free(ptr);
}

static void *startup_realloc(void *ptr, size_t size) {
    if (ptr && !in_startup_buffer(ptr)) {
        errno = ENOMEM; /* cannot happen: nothing else was handed out before dlsym returned */
        return NULL;
    }
    void *q = startup_alloc(size, 16);
    if (q && ptr) memcpy(q, ptr, ((size_t *)ptr)[-1] < size ? ((size_t *)ptr)[-1] : size);
    return q;
}

static void *move_out_of_startup_buffer(void *ptr, size_t size, void *caller) {
    /* To the real allocator; the start-up block is never reused. */
    size_t old = ((size_t *)ptr)[-1];
    void *q = real_malloc(size);
    if (q) memcpy(q, ptr, old < size ? old : size);
    if (ALLOC_ENABLED()) ACCOUNT(q, size, caller);
    return q;
}

PUBLIC void *realloc(void *ptr, size_t size) {
    if (!READY(real_malloc) && not_resolved()) return startup_realloc(ptr, size);
    if (UNLIKELY(in_startup_buffer(ptr))) return move_out_of_startup_buffer(ptr, size, CALLER);
    /* realloc is a free of the old block and an allocation of `size` bytes, sampled like any
     * other. The free fires first, before the allocator may hand the address to another thread.
     * Should realloc then fail, the old block lives on unsampled (the profiler was told it went). */
    untrack(ptr);
    if (!ALLOC_ENABLED()) return real_realloc(ptr, size);
    void *q = real_realloc(ptr, size);
    ACCOUNT(q, size, CALLER);
    return q;
}

PUBLIC void *reallocarray(void *ptr, size_t count, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (!READY(real_malloc) && not_resolved()) return startup_realloc(ptr, total);
    if (UNLIKELY(in_startup_buffer(ptr))) return move_out_of_startup_buffer(ptr, total, CALLER);
    untrack(ptr);
    if (!ALLOC_ENABLED()) return real_realloc(ptr, total);
    void *q = real_realloc(ptr, total);
    ACCOUNT(q, total, CALLER);
    return q;
}

PUBLIC int posix_memalign(void **out, size_t alignment, size_t size) {
    if (!READY(real_malloc) && not_resolved()) {
        void *p = startup_alloc(size, alignment);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    if (!ALLOC_ENABLED()) return real_posix_memalign(out, alignment, size);
    int rc = real_posix_memalign(out, alignment, size);
    if (rc == 0) ACCOUNT(*out, size, CALLER);
    return rc;
}

PUBLIC void *aligned_alloc(size_t alignment, size_t size) {
    if (!READY(real_malloc) && not_resolved()) return startup_alloc(size, alignment);
    aligned_fn f = real_aligned_alloc ? real_aligned_alloc : real_memalign;
    if (!ALLOC_ENABLED()) return f(alignment, size);
    void *p = f(alignment, size);
    ACCOUNT(p, size, CALLER);
    return p;
}

PUBLIC void *memalign(size_t alignment, size_t size) {
    if (!READY(real_malloc) && not_resolved()) return startup_alloc(size, alignment);
    if (!ALLOC_ENABLED()) return real_memalign(alignment, size);
    void *p = real_memalign(alignment, size);
    ACCOUNT(p, size, CALLER);
    return p;
}

PUBLIC void *valloc(size_t size) {
    if (!READY(real_malloc) && not_resolved()) return startup_alloc(size, 4096);
    if (!ALLOC_ENABLED()) return real_valloc(size);
    void *p = real_valloc(size);
    ACCOUNT(p, size, CALLER);
    return p;
}

/* ---- load ------------------------------------------------------------------------------- */

__attribute__((constructor)) static void load(void) {
    if (!READY(real_malloc)) resolve();
    heap_sampling_configure();
}
