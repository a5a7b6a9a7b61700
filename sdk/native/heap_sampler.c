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
 * Settings (read once, at load):
 *   PYCOLLECTOR_HEAP_SAMPLE_BYTES  mean bytes between samples (default 524288, as the contract)
 *   PYCOLLECTOR_HEAP_SAMPLE_TRACE  tests only: a file path. Raises both semaphores as an attached
 *                                  profiler would and appends one line per probe fired to the file
 *                                  (see trace_alloc/trace_free), so a test can check what a
 *                                  profiler would receive without one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* Semaphores: a tracer that attaches to a probe increments its counter in our memory (the kernel
 * does, for uprobes with a ref_ctr_offset), so "no profiler" is one load and a branch. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define PUBLIC __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

HIDDEN unsigned short otel_memory_alloc_semaphore __attribute__((section(".probes"))) __attribute__((used));
HIDDEN unsigned short otel_memory_free_semaphore __attribute__((section(".probes"))) __attribute__((used));
#define ALLOC_ENABLED() UNLIKELY(*(volatile unsigned short *)&otel_memory_alloc_semaphore)
#define FREE_ENABLED() (*(volatile unsigned short *)&otel_memory_free_semaphore)

#define DEFAULT_INTERVAL 524288u

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

/* Initial-exec TLS: the general-dynamic model may allocate a thread's block on first touch, with
 * malloc, which is us. An LD_PRELOAD library is loaded at start-up, where static TLS is there. */
#define TLS __thread __attribute__((tls_model("initial-exec")))

struct thread_state {
    uint64_t bytes_left;  /* before the next sampling boundary; 0 until the thread's first draw */
    uint64_t rng;         /* xorshift64*; 0 until seeded */
    unsigned generation;  /* of the seeds: a fork makes the child's threads draw new ones */
    unsigned char busy;   /* in our slow path: what it allocates is ours, not the program's */
    unsigned char resolving; /* in dlsym: its calloc is served from the start-up buffer */
};
static TLS struct thread_state self;

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
    self.resolving = 1;
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
    self.resolving = 0;
    if (!real_malloc || !real_calloc || !real_realloc || !real_free || !real_posix_memalign || !real_memalign || !real_valloc) {
        static const char message[] = "libpycollector_heap: no next malloc family to wrap (dlsym RTLD_NEXT failed)\n";
        (void)!write(2, message, sizeof message - 1);
        abort();
    }
}

/* True when the caller is to be served from the start-up buffer: it is dlsym's own allocation. */
static int __attribute__((noinline, cold)) not_resolved(void) {
    if (self.resolving) return 1;
    resolve();
    return 0;
}
#define READY(fn) LIKELY(__atomic_load_n(&(fn), __ATOMIC_ACQUIRE) != NULL)

/* ---- sampling --------------------------------------------------------------------------- */

static uint64_t interval = DEFAULT_INTERVAL;
static _Atomic unsigned seed_generation = 1;
static int trace_fd = -1;

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void seed(struct thread_state *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    /* The TLS block's address tells threads apart, the clock processes (and a fork's child from
     * its parent, whose state it copied). */
    uint64_t s = splitmix64((uint64_t)(uintptr_t)t ^ ((uint64_t)now.tv_sec << 32) ^ (uint64_t)now.tv_nsec
                            ^ ((uint64_t)getpid() << 16));
    t->rng = s ? s : 0x2545f4914f6cdd1dull;
    t->generation = atomic_load_explicit(&seed_generation, memory_order_relaxed);
}

/* Bytes to the next boundary, counting the boundary byte: geometric with mean `interval`, as if
 * each byte were a boundary with probability 1/interval, independently. So the count of boundaries
 * in an allocation of s bytes has mean s / interval exactly, wherever it starts, and
 * weight = count * interval is unbiased. Drawn by inversion from one uniform: 1 + floor(E * scale)
 * with E exponential and scale = -1 / ln(1 - 1/interval). */
static double geometric_scale = DEFAULT_INTERVAL - 0.5; /* to 1e-6 relative; set exactly at load */

static uint64_t draw(struct thread_state *t) {
    uint64_t x = t->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t->rng = x;
    double u = (double)(((x * 0x2545f4914f6cdd1dull) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
    double gap = -log(u) * geometric_scale;
    return 1 + (gap < 0x1p62 ? (uint64_t)gap : (uint64_t)1 << 62);
}

static void set_interval(uint64_t bytes) {
    interval = bytes;
    geometric_scale = bytes == 1 ? 0.0 : -1.0 / log1p(-1.0 / (double)bytes);
}

/* How many boundaries `size` bytes cross; leaves bytes_left at the distance past them. */
static uint64_t boundaries_crossed(struct thread_state *t, uint64_t size) {
    if (UNLIKELY(t->generation != atomic_load_explicit(&seed_generation, memory_order_relaxed) || !t->rng)) {
        int first = !t->rng;
        seed(t);
        if (first) t->bytes_left = draw(t); /* the thread's first boundary, from its first byte */
    }
    if (size < t->bytes_left) {
        t->bytes_left -= size;
        return 0;
    }
    uint64_t past = size - t->bytes_left; /* bytes after the first boundary crossed */
    uint64_t n = 1;
    /* A huge allocation against a small interval would draw millions of times: the boundaries in
     * all but its last ~64 intervals are counted by their mean, which keeps the weight unbiased. */
    if (past / interval > 128) {
        uint64_t bulk = past / interval - 64;
        n += bulk;
        past -= bulk * interval;
    }
    for (;;) {
        uint64_t gap = draw(t);
        if (gap > past) {
            t->bytes_left = gap - past;
            return n;
        }
        past -= gap;
        n++;
    }
}

/* ---- which blocks were sampled (the design, and why not a header per block: sampled_set.h) -- */

#include "sampled_set.h"

static void trace_free(uintptr_t p);

static void __attribute__((noinline, cold)) remove_and_fire(void *ptr) {
    if (!sampled_remove((uintptr_t)ptr)) return;
    STAP_PROBE1(otel_memory, free, ptr);
    if (UNLIKELY(trace_fd >= 0)) {
        int saved_errno = errno; /* free keeps errno (POSIX.1-2024, glibc >= 2.33) */
        trace_free((uintptr_t)ptr);
        errno = saved_errno;
    }
}

/* Before the block goes back to the allocator: after that another thread may be handed the same
 * address, and its alloc must come after our free for the profiler. While a profiler follows
 * frees, some sampled block is nearly always alive, so this lookup is every free's: inlined, and
 * only a hit leaves it. */
static inline void untrack(void *ptr) {
    if (UNLIKELY(sampled_count() != 0) && ptr && UNLIKELY(maybe_tracked((uintptr_t)ptr))) remove_and_fire(ptr);
}

/* ---- the test trace ----------------------------------------------------------------------- */

static char *put_str(char *out, const char *s) {
    while (*s) *out++ = *s++;
    return out;
}

static char *put_dec(char *out, uint64_t v) {
    char digits[24];
    int n = 0;
    do digits[n++] = (char)('0' + v % 10); while (v /= 10);
    while (n) *out++ = digits[--n];
    return out;
}

static char *put_hex(char *out, uint64_t v) {
    char digits[20];
    int n = 0;
    do digits[n++] = "0123456789abcdef"[v & 15]; while (v >>= 4);
    *out++ = '0';
    *out++ = 'x';
    while (n) *out++ = digits[--n];
    return out;
}

/* "alloc PID PTR SIZE WEIGHT CALLER" and "free PID PTR", one write each (O_APPEND: lines from
 * threads and forked children do not interleave). CALLER is the symbol the wrapped call returns
 * into (dladdr: an executable's own functions need -rdynamic), else object+offset. */
static void trace_alloc(uintptr_t p, uint64_t size, uint64_t weight, void *caller) {
    char line[512], *out = line;
    out = put_str(out, "alloc ");
    out = put_dec(out, (uint64_t)getpid());
    *out++ = ' ';
    out = put_hex(out, p);
    *out++ = ' ';
    out = put_dec(out, size);
    *out++ = ' ';
    out = put_dec(out, weight);
    *out++ = ' ';
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
    *out++ = '\n';
    (void)!write(trace_fd, line, (size_t)(out - line));
}

static void trace_free(uintptr_t p) {
    char line[64], *out = line;
    out = put_str(out, "free ");
    out = put_dec(out, (uint64_t)getpid());
    *out++ = ' ';
    out = put_hex(out, p);
    *out++ = '\n';
    (void)!write(trace_fd, line, (size_t)(out - line));
}

/* ---- the slow path: a boundary may have been crossed ------------------------------------- */

static void __attribute__((noinline, cold)) sample(void *ptr, size_t size, void *caller) {
    struct thread_state *t = &self;
    if (t->busy || !ptr) return; /* what we allocate ourselves; a failed call allocated nothing */
    t->busy = 1;
    int saved_errno = errno;
    uint64_t n = boundaries_crossed(t, size);
    if (n) {
        uint64_t weight = n * interval;
        /* Remembered only when a profiler listens to frees (live heap): otherwise the free path
         * keeps costing nothing. A block there is no room to remember (mmap failed) is not told
         * either: the profiler would hold it as live for good. */
        if (!FREE_ENABLED() || sampled_add((uintptr_t)ptr)) {
            STAP_PROBE3(otel_memory, alloc, ptr, size, weight);
            if (UNLIKELY(trace_fd >= 0)) trace_alloc((uintptr_t)ptr, size, weight, caller);
        }
    }
    errno = saved_errno;
    t->busy = 0;
}

/* The fast path with a profiler attached: a thread-local compare and subtract. Without one, each
 * wrapper tail-calls the allocator after one load of the semaphore. */
#define ACCOUNT(ptr, size, caller)                                                  \
    do {                                                                            \
        if (LIKELY((uint64_t)(size) < self.bytes_left)) self.bytes_left -= (size); \
        else sample((ptr), (size), (caller));                                       \
    } while (0)

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
        if (self.resolving) return; /* dlsym freeing what it did not get from us: left be */
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

/* ---- load and fork ------------------------------------------------------------------------- */

static void before_fork(void) { pthread_mutex_lock(&table_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&table_lock); }
static void after_fork_child(void) {
    pthread_mutex_unlock(&table_lock);
    /* The child inherited its parent's generator states: new draws, not the parent's sequence. */
    atomic_fetch_add_explicit(&seed_generation, 1, memory_order_relaxed);
}

static void say(const char *what, const char *value) {
    char line[256], *out = line;
    out = put_str(out, "libpycollector_heap: ");
    out = put_str(out, what);
    if (value && strlen(value) < 100) out = put_str(out, value);
    *out++ = '\n';
    (void)!write(2, line, (size_t)(out - line));
}

__attribute__((constructor)) static void load(void) {
    if (!READY(real_malloc)) resolve();
    set_interval(DEFAULT_INTERVAL);
    const char *bytes = getenv("PYCOLLECTOR_HEAP_SAMPLE_BYTES");
    if (bytes && *bytes) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(bytes, &end, 10);
        if (errno || *end || v < 1 || v > (1ull << 40) || bytes[0] == '-')
            say("PYCOLLECTOR_HEAP_SAMPLE_BYTES is not a byte count from 1 to 2^40, using 524288: ", bytes);
        else
            set_interval(v);
    }
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    const char *trace = getenv("PYCOLLECTOR_HEAP_SAMPLE_TRACE");
    if (trace && *trace) {
        trace_fd = open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (trace_fd < 0) {
            say("cannot open PYCOLLECTOR_HEAP_SAMPLE_TRACE: ", trace);
        } else {
            __atomic_add_fetch(&otel_memory_alloc_semaphore, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&otel_memory_free_semaphore, 1, __ATOMIC_RELAXED);
        }
    }
}
