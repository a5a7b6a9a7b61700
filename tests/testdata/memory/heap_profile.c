/* The memory profiler's workload (tests/test_memory_profiling.py): three named functions allocate
 * in known byte proportions, 60/30/10 of TOTAL_MIB, sizes log-uniform from 16 B to 1 MiB;
 * alloc_hot and alloc_warm free everything, alloc_leaky keeps every block it allocated. It spins
 * until SIGUSR1 (so the profiler sees it on a CPU, announces it and attaches to its probes before
 * the first allocation), allocates, prints its own byte counts (the truth), then spins again until
 * SIGUSR2 with the leaked blocks alive (the live heap's moment), and exits.
 * It prints "ready" once its signals are handled.
 * Usage: heap_profile TOTAL_MIB
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../native/xorshift.h"

#define MIN_SIZE 16
#define MAX_SIZE (1u << 20)
#define WINDOW 16
#define MAX_KEPT 200000

static volatile sig_atomic_t phase;
static void *kept[MAX_KEPT];
static size_t kept_count, leaked_bytes;
static volatile uint64_t sink;

static void next_phase(int signal) { phase = signal == SIGUSR1 ? 1 : 2; }

static size_t pick_size(uint64_t *state) {
    double u = (double)(next(state) >> 11) * 0x1.0p-53;
    size_t size = (size_t)__builtin_exp2(4.0 + 16.0 * u);
    return size < MIN_SIZE ? MIN_SIZE : size > MAX_SIZE ? MAX_SIZE : size;
}

/* Inlined into each named function, so each malloc returns into that function's own code. */
static inline __attribute__((always_inline)) size_t allocate(uint64_t budget, uint64_t *state, int keep) {
    void *window[WINDOW] = {0};
    uint64_t spent = 0;
    unsigned turn = 0;
    while (spent < budget) {
        size_t size = pick_size(state);
        if (size > budget - spent) size = budget - spent < MIN_SIZE ? MIN_SIZE : budget - spent;
        unsigned char *p = malloc(size);
        if (!p) abort();
        spent += size;
        p[0] = (unsigned char)turn;
        p[size - 1] = (unsigned char)size;
        sink += p[0];
        if (keep && kept_count < MAX_KEPT) {
            kept[kept_count++] = p;
            leaked_bytes += size;
            continue;
        }
        if (keep) {
            free(p);
            continue;
        }
        unsigned slot = turn++ % WINDOW;
        free(window[slot]);
        window[slot] = p;
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

__attribute__((noinline)) void spin_until(int wanted) {
    while (phase < wanted) sink++;
}

int main(int argc, char **argv) {
    uint64_t total = (argc > 1 ? strtoull(argv[1], NULL, 10) : 64) << 20;
    signal(SIGUSR1, next_phase);
    signal(SIGUSR2, next_phase);
    printf("ready\n");
    fflush(stdout);
    spin_until(1);
    size_t hot = 0, warm = 0, leaky = 0;
    for (int round = 0; round < 8; round++) {  /* interleaved, as a program's call sites are */
        hot += alloc_hot(total * 6 / 80);
        warm += alloc_warm(total * 3 / 80);
        leaky += alloc_leaky(total / 80);
    }
    printf("bytes alloc_hot %zu\nbytes alloc_warm %zu\nbytes alloc_leaky %zu\nleaked %zu\n", hot, warm, leaky, leaked_bytes);
    fflush(stdout);
    spin_until(2);
    return 0;
}
