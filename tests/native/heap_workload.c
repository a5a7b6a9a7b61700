/* The heap sampler's workload: three named functions allocate in known byte proportions (60/30/10
 * of TOTAL_MIB), sizes log-uniform from 16 B to 1 MiB, through every wrapped call (malloc, calloc,
 * realloc growing and shrinking, posix_memalign, aligned_alloc, memalign, valloc). alloc_hot and
 * alloc_warm free everything; alloc_leaky keeps every block it ends with. It prints its own byte
 * counts (the truth) and what it checked, all of which must read the same with the sampler loaded:
 * a checksum of the data it wrote and read back, the alignment of every aligned block, the contents
 * realloc kept, calloc's zeros and malloc_usable_size. Deterministic: the same output every run.
 *
 * Build with -rdynamic, so the sampler's test trace names the three functions.
 * Usage: heap_workload TOTAL_MIB
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "xorshift.h"

#define MIN_SIZE 16
#define MAX_SIZE (1u << 20)
#define WINDOW 16 /* blocks alloc_hot and alloc_warm keep alive at once, freed oldest first */
#define MAX_KEPT 100000

struct checks {
    uint64_t checksum, misaligned, realloc_mismatch, calloc_nonzero, usable_short, failed;
};
static struct checks checks;
static void *kept[MAX_KEPT];
static size_t kept_count, leaked_bytes;

/* log-uniform in [MIN_SIZE, MAX_SIZE]: 2^(4 + 16u) */
static size_t pick_size(uint64_t *state) {
    double u = (double)(next(state) >> 11) * 0x1.0p-53;
    size_t size = (size_t)__builtin_exp2(4.0 + 16.0 * u);
    return size < MIN_SIZE ? MIN_SIZE : size > MAX_SIZE ? MAX_SIZE : size;
}

static void fill(unsigned char *p, size_t from, size_t to, uint64_t seed) {
    for (size_t i = from; i < to; i++) p[i] = (unsigned char)((seed + i) * 0x9d ^ (i >> 8));
}

static int holds(const unsigned char *p, size_t from, size_t to, uint64_t seed) {
    for (size_t i = from; i < to; i++)
        if (p[i] != (unsigned char)((seed + i) * 0x9d ^ (i >> 8))) return 0;
    return 1;
}

static void read_back(const unsigned char *p, size_t size) {
    uint64_t sum = checks.checksum, word;
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {
        memcpy(&word, p + i, 8);
        sum = (sum ^ word) * 0x100000001b3ull;
    }
    for (; i < size; i++) sum = (sum ^ p[i]) * 0x100000001b3ull;
    checks.checksum = sum;
    if (malloc_usable_size((void *)p) < size) checks.usable_short++;
}

static void aligned(void *p, size_t alignment) {
    if ((uintptr_t)p % alignment) checks.misaligned++;
}

/* Inlined into each named function, so each allocation returns into that function's own code. */
static inline __attribute__((always_inline)) size_t allocate(uint64_t budget, uint64_t *state, int keep) {
    void *window[WINDOW] = {0};
    size_t window_sizes[WINDOW] = {0};
    uint64_t spent = 0;
    unsigned turn = 0;
    while (spent < budget) {
        size_t size = pick_size(state);
        if (size > budget - spent) size = budget - spent < MIN_SIZE ? MIN_SIZE : budget - spent;
        uint64_t seed = next(state);
        unsigned char *p = NULL;
        size_t alignment = 0;
        switch (turn++ % 8) {
        case 0:
        case 1:
            p = malloc(size);
            spent += size;
            break;
        case 2: {
            size_t count = size >= 64 ? 4 : 1;
            size = size / count * count;
            p = calloc(count, size / count);
            spent += size;
            if (p)
                for (size_t i = 0; i < size; i++)
                    if (p[i]) {
                        checks.calloc_nonzero++;
                        break;
                    }
            break;
        }
        case 3: { /* grow */
            size_t first = size / 2 < MIN_SIZE ? MIN_SIZE : size / 2;
            p = malloc(first);
            spent += first;
            if (!p) break;
            fill(p, 0, first, seed);
            p = realloc(p, size);
            spent += size;
            if (p && !holds(p, 0, first, seed)) checks.realloc_mismatch++;
            break;
        }
        case 4: { /* shrink */
            size_t last = size / 3 < MIN_SIZE ? MIN_SIZE : size / 3;
            p = malloc(size);
            spent += size;
            if (!p) break;
            fill(p, 0, size, seed);
            p = realloc(p, last);
            spent += last;
            size = last;
            if (p && !holds(p, 0, last, seed)) checks.realloc_mismatch++;
            break;
        }
        case 5: {
            void *q = NULL;
            alignment = (size_t)64 << (seed % 7); /* 64 B to 4 KiB */
            if (posix_memalign(&q, alignment, size) == 0) p = q;
            spent += size;
            break;
        }
        case 6:
            alignment = (size_t)16 << (seed % 9); /* 16 B to 4 KiB */
            p = (seed & 1) ? aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment)
                           : memalign(alignment, size);
            if (seed & 1) size = (size + alignment - 1) / alignment * alignment;
            spent += size;
            break;
        case 7:
            alignment = (size_t)sysconf(_SC_PAGESIZE);
            p = valloc(size);
            spent += size;
            break;
        }
        if (!p) {
            checks.failed++;
            continue;
        }
        if (alignment) aligned(p, alignment);
        fill(p, 0, size, seed);
        read_back(p, size);
        if (keep) {
            if (kept_count < MAX_KEPT) {
                kept[kept_count++] = p;
                leaked_bytes += size;
            } else {
                free(p);
            }
            continue;
        }
        unsigned slot = turn % WINDOW;
        if (window[slot]) {
            read_back(window[slot], window_sizes[slot]);
            free(window[slot]);
        }
        window[slot] = p;
        window_sizes[slot] = size;
    }
    for (unsigned i = 0; i < WINDOW; i++) free(window[i]);
    return spent;
}

__attribute__((noinline)) size_t alloc_hot(uint64_t budget) {
    static uint64_t state = 0x9e3779b97f4a7c15ull;
    return allocate(budget, &state, 0);
}

__attribute__((noinline)) size_t alloc_warm(uint64_t budget) {
    static uint64_t state = 0xbf58476d1ce4e5b9ull;
    return allocate(budget, &state, 0);
}

__attribute__((noinline)) size_t alloc_leaky(uint64_t budget) {
    static uint64_t state = 0x94d049bb133111ebull;
    return allocate(budget, &state, 1);
}

int main(int argc, char **argv) {
    uint64_t total = (argc > 1 ? strtoull(argv[1], NULL, 10) : 64) << 20;
    /* Interleaved in rounds, as a program's call sites are, not one after the other. */
    size_t hot = 0, warm = 0, leaky = 0;
    for (int round = 0; round < 8; round++) {
        hot += alloc_hot(total * 6 / 80);
        warm += alloc_warm(total * 3 / 80);
        leaky += alloc_leaky(total / 80);
    }
    printf("bytes alloc_hot %zu\nbytes alloc_warm %zu\nbytes alloc_leaky %zu\nleaked %zu\n", hot, warm, leaky, leaked_bytes);
    printf("checksum %016llx\nmisaligned %llu\nrealloc_mismatch %llu\ncalloc_nonzero %llu\nusable_short %llu\nfailed %llu\n",
           (unsigned long long)checks.checksum, (unsigned long long)checks.misaligned, (unsigned long long)checks.realloc_mismatch,
           (unsigned long long)checks.calloc_nonzero, (unsigned long long)checks.usable_short, (unsigned long long)checks.failed);
    return 0;
}
