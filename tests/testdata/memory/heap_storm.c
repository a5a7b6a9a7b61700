/* A process that allocates as fast as it can (test_memory_profiling's back-pressure test): spins
 * until SIGUSR1, then mallocs and frees 64-byte blocks for SECONDS, then makes 20 more allocations
 * 100 ms apart (the last ones walked carry what the storm's throttled ones stood for), prints
 * "allocated BYTES" and spins until SIGUSR2. It prints "ready" once its signals are handled.
 * With ABRUPT, it exits right after the storm: its last throttled allocations are owed to no one.
 * Usage: heap_storm SECONDS [ABRUPT] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile sig_atomic_t phase;
static volatile unsigned long sink;

static void next_phase(int signal) { phase = signal == SIGUSR1 ? 1 : 2; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void allocate(unsigned long *bytes) {
    char *p = malloc(64);
    p[0] = (char)*bytes;
    sink += (unsigned long)p;
    free(p);
    *bytes += 64;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3;
    unsigned long bytes = 0;
    signal(SIGUSR1, next_phase);
    signal(SIGUSR2, next_phase);
    printf("ready\n");
    fflush(stdout);
    while (phase < 1) sink++;
    for (double end = now() + seconds; now() < end;)
        for (int i = 0; i < 1000; i++)
            allocate(&bytes);
    if (argc > 2) {
        printf("allocated %lu\n", bytes);
        return 0;
    }
    for (int i = 0; i < 20; i++) {
        struct timespec pause = {0, 100000000};
        nanosleep(&pause, NULL);
        allocate(&bytes);
    }
    printf("allocated %lu\n", bytes);
    fflush(stdout);
    while (phase < 2) sink++;
    return 0;
}
