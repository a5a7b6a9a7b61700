/* A library with otel_memory probes of its own, which tests/testdata/memory/dlopen_probes.c
 * opens after it started (test_memory_profiling: a library dlopen()ed later gets attached).
 * lib_work() spins in the library's code, so the profiler samples a pc there and reads the
 * process's mappings again, and allocates as it goes: each allocation fires otel_memory:alloc
 * (weight: its size) while a profiler holds the semaphore up, and is counted. */
#define _SDT_HAS_SEMAPHORES 1
#include <stdlib.h>
#include <sys/sdt.h>
#include <time.h>

unsigned short otel_memory_alloc_semaphore __attribute__((section(".probes"))) __attribute__((used));

static volatile unsigned long sink;

__attribute__((noinline)) void *lib_alloc(size_t size, unsigned long *fired) {
    void *p = malloc(size);
    if (*(volatile unsigned short *)&otel_memory_alloc_semaphore) {
        STAP_PROBE3(otel_memory, alloc, p, size, size);
        ++*fired;
    }
    return p;
}

unsigned long lib_work(double seconds) {
    struct timespec began, now;
    unsigned long fired = 0;
    clock_gettime(CLOCK_MONOTONIC, &began);
    do {
        for (int i = 0; i < 100000; i++) sink += i;
        free(lib_alloc(4096, &fired));
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - began.tv_sec) + (now.tv_nsec - began.tv_nsec) / 1e9 < seconds);
    return fired;
}
