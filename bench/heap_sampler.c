/* The heap sampler's cost on the smallest allocations: N rounds of malloc(64) and free, timed by
 * the program itself on its thread's CPU clock (so start-up, the loader and time other programs
 * took the CPU from it are out of it). Prints nanoseconds per round.
 * With KEEP_MIB, that many MiB are allocated in 64 KiB blocks and kept before the loop: with the
 * semaphores raised, some of them are sampled blocks alive, so every free looks itself up.
 * With "wait", it prints "ready" before the loop and, allocating, waits for a line on stdin: the
 * bench attaches a profiler to the running process meanwhile (bench/memory.py), and is told how
 * many it did ("spun N"), and, at each "mark" line before that, how many so far ("marked N").
 * Usage: heap_sampler_loop N [KEEP_MIB [wait]] */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    long keep = argc > 2 ? atol(argv[2]) * 16 : 0;
    for (long i = 0; i < keep; i++) {
        void *p = malloc(65536);
        __asm__ volatile("" : : "r"(p) : "memory"); /* kept */
    }
    if (argc > 3 && strcmp(argv[3], "wait") == 0) {
        /* Allocating meanwhile, as the program it stands for would: a profiler learns of a
         * process from its CPU samples, and of the sampler's library from samples in it. */
        struct pollfd input = {.fd = 0, .events = POLLIN};
        char line[16];
        long spun = 0;
        printf("ready\n");
        fflush(stdout);
        for (;;) {
            while (poll(&input, 1, 0) == 0)
                for (int i = 0; i < 100000; i++, spun++) {
                    void *p = malloc(64);
                    __asm__ volatile("" : : "r"(p) : "memory");
                    free(p);
                }
            if (!fgets(line, sizeof line, stdin))
                return 1;
            if (strncmp(line, "mark", 4) != 0)
                break;
            printf("marked %ld\n", spun); /* e.g. when a profiler attached: what it did not see */
            fflush(stdout);
        }
        printf("spun %ld\n", spun); /* malloc+free pairs while waiting, for who counts them all */
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
