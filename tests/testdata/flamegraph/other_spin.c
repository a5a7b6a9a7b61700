/* A second busy process for the flame graph tests, with a hot function of its own (other_spin),
 * so that a process filter has something to leave out. Usage: other_spin SECONDS */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void other_spin(double seconds) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long x = 1;
    do {
        for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1;
        sink = x;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    other_spin(argc > 1 ? atof(argv[1]) : 1.0);
    return 0;
}
