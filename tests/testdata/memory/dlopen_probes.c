/* Spins SECONDS_BEFORE in its own code, then dlopen()s LIBRARY (probes_lib.c) and runs its
 * lib_work for SECONDS_AFTER, and prints how many allocations fired otel_memory:alloc.
 * Usage: dlopen_probes LIBRARY SECONDS_BEFORE SECONDS_AFTER */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    struct timespec began, now;
    clock_gettime(CLOCK_MONOTONIC, &began);
    do {
        for (int i = 0; i < 100000; i++) sink += i;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - began.tv_sec) + (now.tv_nsec - began.tv_nsec) / 1e9 < atof(argv[2]));
    void *library = dlopen(argv[1], RTLD_NOW);
    if (!library) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    unsigned long (*work)(double) = (unsigned long (*)(double))dlsym(library, "lib_work");
    printf("fired %lu\n", work(atof(argv[3])));
    return 0;
}
