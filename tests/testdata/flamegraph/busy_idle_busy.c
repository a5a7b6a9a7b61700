/* The timeline's workload: busy in first_busy for SECONDS, asleep for SECONDS, then busy in
 * second_busy for SECONDS, so a timeline shows two busy stretches with a gap between. Usage:
 * busy_idle_busy SECONDS */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) static void spin(double seconds) {
    double end = now() + seconds;
    unsigned long x = 1;
    do {
        for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1;
        sink = x;
    } while (now() < end);
}

/* (Each does something after spin, so that its call is not a jump that leaves it off the stack.) */
__attribute__((noinline)) static void first_busy(double seconds) { spin(seconds); sink++; }
__attribute__((noinline)) static void second_busy(double seconds) { spin(seconds); sink++; }

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    first_busy(seconds);
    usleep((useconds_t)(seconds * 1e6));
    second_busy(seconds);
    return 0;
}
