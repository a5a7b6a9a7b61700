/* Which blocks were sampled: the set the heap sampler's free path looks itself up in. Included
 * by heap_sampling.h (the native and the Python samplers), and alone by tests/native/heap_set_test.c.
 *
 * Every free must tell a sampled pointer from the others, cheaply. The reference sampler puts a
 * magic header in front of each sampled block (x86-64) and hands out the address after it. We keep
 * the program's pointers untouched and remember the sampled ones in a hash set instead:
 *  - nothing the program sees changes: malloc_usable_size, an aligned block's alignment, a block
 *    realloc'd or freed by code that reaches the allocator without us (a libc-internal path, a
 *    library bound to the allocator directly), are all the allocator's own;
 *  - a free never reads memory in front of a pointer it did not hand out: pointers from before we
 *    were loaded, or from another allocator's region whose previous page may be unmapped, are
 *    safe; no bytes of the program's data can be mistaken for a tag;
 *  - the cost lands on free only while a sampled block is alive: sampled_count() is zero
 *    otherwise, one shared read-mostly load. With one alive, an unsampled free reads one bit of a
 *    1 KiB filter (a bit per bucket of addresses, set while a sampled block of the bucket lives)
 *    and, for the few whose bucket is taken, probes a table kept at most 1/4 full (about one slot
 *    read; with the default interval a 1 GiB heap is ~2,000 entries, a 64 KiB table). The filter
 *    is for the cache: a free of a program that streams through memory found the table's slot
 *    evicted most times (perf: the slot's load was 43% of the Python sampler's free hook, in a
 *    json benchmark with ~100 sampled blocks alive), where 16 lines that every free reads stay in.
 * Only sampled allocations and their frees write the table, under a mutex. Readers take no lock:
 * a pointer is looked for only by the thread freeing it, inserted before malloc returned it, so
 * concurrent inserts never hide it; deletions (backward shift, which moves entries) and growth
 * bump `moves` like a seqlock, and a reader that overlapped one re-checks under the mutex. Old
 * tables stay mapped (they double, so at most as much again): a late reader may still be in one.
 */
#ifndef PYCOLLECTOR_SAMPLED_SET_H
#define PYCOLLECTOR_SAMPLED_SET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

struct table {
    size_t mask;
    unsigned shift; /* 64 - log2(slots): Fibonacci hashing keeps the product's top bits */
    _Atomic uintptr_t slots[];
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct table *_Atomic table;
static _Atomic unsigned long moves; /* odd while entries move */
static _Atomic size_t tracked;      /* live entries; read on every free */

static size_t home(const struct table *t, uintptr_t p) {
    return (size_t)(((uint64_t)p * 0x9e3779b97f4a7c15ull) >> t->shift);
}

/* The filter: bit b set while filter_counts[b] > 0, the entries of the table in bucket b. Bits are
 * set before the pointer is handed out (as entries are inserted) and cleared only when the
 * bucket's last entry goes, by atomic or/and on the word: a reader looking for a live entry of
 * its own always sees its bit. The counts are the writers' alone (under the mutex). */
#define FILTER_SHIFT 13
#define FILTER_BITS (1 << FILTER_SHIFT)
static _Atomic uint64_t filter[FILTER_BITS / 64];
static uint32_t filter_counts[FILTER_BITS];

static inline __attribute__((always_inline)) size_t bucket(uintptr_t p) {
    return (size_t)(((uint64_t)p * 0xbf58476d1ce4e5b9ull) >> (64 - FILTER_SHIFT)); /* (another multiplier than home's) */
}

static inline __attribute__((always_inline)) int in_filter(uintptr_t p) {
    size_t b = bucket(p);
    return (atomic_load_explicit(&filter[b / 64], memory_order_relaxed) >> (b % 64)) & 1;
}

static void filter_add_locked(uintptr_t p) {
    size_t b = bucket(p);
    if (filter_counts[b]++ == 0) atomic_fetch_or_explicit(&filter[b / 64], 1ull << (b % 64), memory_order_relaxed);
}

static void filter_remove_locked(uintptr_t p) {
    size_t b = bucket(p);
    if (--filter_counts[b] == 0) atomic_fetch_and_explicit(&filter[b / 64], ~(1ull << (b % 64)), memory_order_relaxed);
}

static inline __attribute__((always_inline)) int probe(const struct table *t, uintptr_t p) {
    for (size_t i = home(t, p);; i = (i + 1) & t->mask) {
        uintptr_t v = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (v == p) return 1;
        if (v == 0) return 0;
    }
}

/* False when p is there already: its block was freed where we could not see it (__libc_free, a
 * library bound to libc directly), and this, its address's next sampled block, takes the entry
 * over. (With a header, that free would have handed libc an interior pointer.) */
static int insert_locked(struct table *t, uintptr_t p) {
    size_t i = home(t, p);
    for (uintptr_t v; (v = atomic_load_explicit(&t->slots[i], memory_order_relaxed)); i = (i + 1) & t->mask)
        if (v == p) return 0;
    atomic_store_explicit(&t->slots[i], p, memory_order_relaxed);
    return 1;
}

static void begin_move(void) {
    atomic_store_explicit(&moves, atomic_load_explicit(&moves, memory_order_relaxed) + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static void end_move(void) {
    atomic_store_explicit(&moves, atomic_load_explicit(&moves, memory_order_relaxed) + 1, memory_order_release);
}

static struct table *table_with_room_locked(void) {
    struct table *t = atomic_load_explicit(&table, memory_order_relaxed);
    size_t live = atomic_load_explicit(&tracked, memory_order_relaxed);
    if (t && (live + 1) * 4 <= t->mask + 1) return t;
    size_t slots = t ? (t->mask + 1) * 2 : 512;
    struct table *bigger = mmap(NULL, sizeof *bigger + slots * sizeof(uintptr_t), PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bigger == MAP_FAILED) return NULL;
    bigger->mask = slots - 1;
    bigger->shift = (unsigned)__builtin_clzll((unsigned long long)slots) + 1;
    if (t) {
        begin_move();
        for (size_t i = 0; i <= t->mask; i++) {
            uintptr_t v = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
            if (v) (void)insert_locked(bigger, v);
        }
    }
    atomic_store_explicit(&table, bigger, memory_order_release);
    if (t) end_move();
    return bigger;
}

/* False only when there is no room (mmap failed). */
static int sampled_add(uintptr_t p) {
    pthread_mutex_lock(&table_lock);
    struct table *t = table_with_room_locked();
    if (t && insert_locked(t, p)) {
        filter_add_locked(p);
        atomic_fetch_add_explicit(&tracked, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&table_lock);
    return t != NULL;
}

static int remove_locked(struct table *t, uintptr_t p) {
    size_t i = home(t, p);
    for (;; i = (i + 1) & t->mask) {
        uintptr_t v = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (v == 0) return 0;
        if (v == p) break;
    }
    begin_move();
    /* Backward shift: pull later entries of the run into the hole if their home allows it, so a
     * probe still stops at the first empty slot and no tombstones pile up. */
    for (size_t j = i;;) {
        atomic_store_explicit(&t->slots[i], 0, memory_order_relaxed);
        for (;;) {
            j = (j + 1) & t->mask;
            uintptr_t v = atomic_load_explicit(&t->slots[j], memory_order_relaxed);
            if (v == 0) goto done;
            size_t k = home(t, v);
            int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
            if (!stays) {
                atomic_store_explicit(&t->slots[i], v, memory_order_relaxed);
                i = j;
                break;
            }
        }
    }
done:
    end_move();
    filter_remove_locked(p);
    atomic_fetch_sub_explicit(&tracked, 1, memory_order_relaxed);
    return 1;
}

/* True when p may be in the set: found, or a move overlapped the look and only the mutex can say. */
static inline __attribute__((always_inline)) int maybe_tracked(uintptr_t p) {
    if (!in_filter(p)) return 0;
    unsigned long before = atomic_load_explicit(&moves, memory_order_acquire);
    if (before & 1) return 1;
    struct table *t = atomic_load_explicit(&table, memory_order_acquire);
    int found = t && probe(t, p);
    atomic_thread_fence(memory_order_acquire);
    return found || atomic_load_explicit(&moves, memory_order_relaxed) != before;
}

/* True when p was in the set, and is no more. */
static int sampled_remove(uintptr_t p) {
    if (!maybe_tracked(p)) return 0;
    pthread_mutex_lock(&table_lock);
    struct table *t = atomic_load_explicit(&table, memory_order_relaxed);
    int removed = t && remove_locked(t, p);
    pthread_mutex_unlock(&table_lock);
    return removed;
}

/* Zero while no sampled block is alive: then free has nothing to look up. */
static inline size_t sampled_count(void) {
    return atomic_load_explicit(&tracked, memory_order_relaxed);
}

#endif
