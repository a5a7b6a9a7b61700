/* A hostile process of THREADS threads (tests/test_hostile_waits.py): each waits on one futex word
 * with a timeout of WAKE_MS, again and again, so the process has THREADS threads in futex waits
 * at any time and THREADS * 1000 / WAKE_MS switches off a CPU a second, each a lock wait. Their
 * wake-ups are spread over WAKE_MS (each starts after its own share of it): all at once, 10,000
 * threads runnable together every WAKE_MS are a load of hundreds on two CPUs, a denial of CPU
 * that starves every process alike, not a test of what a profiler does with their waits. Runs
 * until killed; prints "threads N" to stderr once they are all started.
 * Usage: many_threads [THREADS] */
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define WAKE_MS 1000

static _Atomic int word;

__attribute__((noinline)) static void *wait_a_while(void *arg) {
    long phase_us = (long)arg;
    const struct timespec phase = {phase_us / 1000000, (phase_us % 1000000) * 1000};
    nanosleep(&phase, NULL);
    const struct timespec timeout = {WAKE_MS / 1000, (WAKE_MS % 1000) * 1000 * 1000};
    for (;;)
        syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 10000, started = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (int i = 0; i < threads; i++) {
        pthread_t thread;
        long phase_us = (long)i * WAKE_MS * 1000 / threads;
        if (pthread_create(&thread, &attr, wait_a_while, (void *)phase_us) == 0)
            started++;
    }
    fprintf(stderr, "threads %d\n", started);
    for (;;)
        pause();
}
