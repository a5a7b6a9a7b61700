/* The heap sampler's cost on the smallest allocations: N rounds of malloc(64) and free, timed by
 * the program itself on its thread's CPU clock (so start-up, the loader and time other programs
 * took the CPU from it are out of it). Prints nanoseconds per round.
 * With KEEP_MIB, that many MiB are allocated in 64 KiB blocks and kept before the loop: with the
 * semaphores raised, some of them are sampled blocks alive, so every free looks itself up.
 * Usage: heap_sampler_loop N [KEEP_MIB] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    long keep = argc > 2 ? atol(argv[2]) * 16 : 0;
    for (long i = 0; i < keep; i++) {
        void *p = malloc(65536);
        __asm__ volatile("" : : "r"(p) : "memory"); /* kept */
    }
    struct timespec start, end;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    for (long i = 0; i < n; i++) {
        void *p = malloc(64);
        __asm__ volatile("" : : "r"(p) : "memory"); /* or the compiler drops the pair */
        free(p);
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    printf("%.3f\n", ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / n);
    return 0;
}
