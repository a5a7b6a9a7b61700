/* A process that floods the live heap (test_memory_profiling): spins until SIGUSR1, then
 * allocates COUNT blocks of 64 bytes and frees none (run at a 64-byte sampling interval, each is
 * a sampled allocation still alive), prints "leaked COUNT", and spins until SIGUSR2 (it prints
 * "ready" once its signals are handled).
 * Usage: heap_flood COUNT */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static volatile sig_atomic_t phase;
static volatile unsigned long sink;

static void next_phase(int signal) { phase = signal == SIGUSR1 ? 1 : 2; }

int main(int argc, char **argv) {
    long count = argc > 1 ? atol(argv[1]) : 10000;
    signal(SIGUSR1, next_phase);
    signal(SIGUSR2, next_phase);
    printf("ready\n");
    fflush(stdout);
    while (phase < 1) sink++;
    for (long i = 0; i < count; i++) {
        char *p = malloc(64);
        p[0] = (char)i;
        sink += (unsigned long)p;
    }
    printf("leaked %ld\n", count);
    fflush(stdout);
    while (phase < 2) sink++;
    return 0;
}
