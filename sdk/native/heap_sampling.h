/* What every heap sampler we ship shares: the OpenTelemetry memory-profiling probes and their
 * semaphores, the per-thread byte-interval sampling, the set of sampled blocks alive, the test
 * trace, the settings and fork handling. Included by the native sampler (heap_sampler.c, which
 * wraps the malloc family) and by the Python one (sdk/python's pycollector_heap.c, which wraps
 * CPython's allocator domains), so both sample alike and fire the same probes:
 *
 *   otel_memory:alloc(ptr, size, weight)  on a sampled allocation; weight = nsamples * interval,
 *                                          the unbiased estimate of the bytes it stands for
 *   otel_memory:free(ptr)                 on the free of a pointer that alloc was fired for
 *
 * The includer defines, before including:
 *   HEAP_SAMPLER_NAME  the prefix of its messages on stderr ("libpycollector_heap")
 *   HEAP_TLS           the storage of its thread state: initial-exec TLS where it is loaded at
 *                      start-up (LD_PRELOAD), the default model where it is dlopen()ed
 * and, after including, put_caller(): how its trace names the allocating call.
 *
 * Its wrappers call ACCOUNT() after each allocation while ALLOC_ENABLED(), untrack() before each
 * free (and realloc), and heap_sampling_configure() once before sampling.
 *
 * Settings (read by heap_sampling_configure):
 *   PYCOLLECTOR_HEAP_SAMPLE_BYTES  mean bytes between samples (default 524288, as the contract)
 *   PYCOLLECTOR_HEAP_SAMPLE_TRACE  tests only: a file path. Raises both semaphores as an attached
 *                                  profiler would and appends one line per probe fired to the file
 *                                  (see trace_alloc/trace_free), so a test can check what a
 *                                  profiler would receive without one.
 */
#ifndef PYCOLLECTOR_HEAP_SAMPLING_H
#define PYCOLLECTOR_HEAP_SAMPLING_H

#if !defined(HEAP_SAMPLER_NAME) || !defined(HEAP_TLS)
#error "define HEAP_SAMPLER_NAME and HEAP_TLS before including heap_sampling.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Semaphores: a tracer that attaches to a probe increments its counter in our memory (the kernel
 * does, for uprobes with a ref_ctr_offset), so "no profiler" is one load and a branch. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

HIDDEN unsigned short otel_memory_alloc_semaphore __attribute__((section(".probes"))) __attribute__((used));
HIDDEN unsigned short otel_memory_free_semaphore __attribute__((section(".probes"))) __attribute__((used));
#define ALLOC_ENABLED() UNLIKELY(*(volatile unsigned short *)&otel_memory_alloc_semaphore)
#define FREE_ENABLED() (*(volatile unsigned short *)&otel_memory_free_semaphore)

#define DEFAULT_INTERVAL 524288u

struct thread_state {
    uint64_t bytes_left;  /* before the next sampling boundary; 0 until the thread's first draw */
    uint64_t rng;         /* xorshift64*; 0 until seeded */
    unsigned generation;  /* of the seeds: a fork makes the child's threads draw new ones */
    unsigned char busy;   /* in a call we account: what it allocates within is not the program's */
};
static HEAP_TLS struct thread_state self;

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

/* What was fired since load, for a sampler that reports it (the Python one's stats()): two
 * relaxed adds on the slow path, one in ~interval bytes. */
static struct {
    _Atomic uint64_t allocs, bytes, frees;
} fired;

static void __attribute__((noinline, cold)) remove_and_fire(void *ptr) {
    if (!sampled_remove((uintptr_t)ptr)) return;
    STAP_PROBE1(otel_memory, free, ptr);
    atomic_fetch_add_explicit(&fired.frees, 1, memory_order_relaxed);
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

/* The includer's: the allocating call as the trace names it, at most 320 bytes, no spaces. */
static char *put_caller(char *out, const void *caller);

/* "alloc PID PTR SIZE WEIGHT CALLER" and "free PID PTR", one write each (O_APPEND: lines from
 * threads and forked children do not interleave). */
static void trace_alloc(uintptr_t p, uint64_t size, uint64_t weight, const void *caller) {
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
    out = put_caller(out, caller);
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

static void __attribute__((noinline, cold)) sample(void *ptr, size_t size, const void *caller) {
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
            atomic_fetch_add_explicit(&fired.allocs, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&fired.bytes, weight, memory_order_relaxed);
        }
    }
    errno = saved_errno;
    t->busy = 0;
}

/* The fast path with a profiler attached: a thread-local compare and subtract. ACCOUNT_IN takes
 * the thread's state where the caller has it already (a dlopen()ed sampler's TLS is a call away). */
#define ACCOUNT_IN(t, ptr, size, caller)                                          \
    do {                                                                          \
        if (LIKELY((uint64_t)(size) < (t)->bytes_left)) (t)->bytes_left -= (size); \
        else sample((ptr), (size), (caller));                                     \
    } while (0)
#define ACCOUNT(ptr, size, caller) ACCOUNT_IN(&self, ptr, size, caller)

/* ---- settings and fork ------------------------------------------------------------------- */

static void before_fork(void) { pthread_mutex_lock(&table_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&table_lock); }
static void after_fork_child(void) {
    pthread_mutex_unlock(&table_lock);
    /* The child inherited its parent's generator states: new draws, not the parent's sequence. */
    atomic_fetch_add_explicit(&seed_generation, 1, memory_order_relaxed);
}

static void say(const char *what, const char *value) {
    char line[256], *out = line;
    out = put_str(out, HEAP_SAMPLER_NAME ": ");
    out = put_str(out, what);
    if (value && strlen(value) < 100) out = put_str(out, value);
    *out++ = '\n';
    (void)!write(2, line, (size_t)(out - line));
}

/* Once, before the first allocation is accounted: the interval and the test trace from the
 * environment, and the fork handlers. */
static void heap_sampling_configure(void) {
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

#endif
