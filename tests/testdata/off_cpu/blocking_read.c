/* Off-CPU test workload (tests/test_profiling_off_cpu.py): the main thread computes for 25 ms,
 * then blocks in read() on a pipe until a writer thread answers 75 ms later, for argv[1] seconds,
 * after a 1 s sleep that lets the profiler load this program's unwind tables. It prints the
 * nanoseconds it spent blocked in read(), measured around the call. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int requests[2], answers[2];

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

__attribute__((noinline)) void compute(long long ns)
{
    long long end = now_ns() + ns;
    volatile unsigned x = 0;
    while (now_ns() < end)
        x++;
}

static void *answer(void *unused)
{
    char c;
    while (read(requests[0], &c, 1) == 1) {
        usleep(75000);
        if (write(answers[1], &c, 1) != 1)
            break;
    }
    return unused;
}

__attribute__((noinline)) long long wait_for_data(void)
{
    char c = 'x';
    if (write(requests[1], &c, 1) != 1)
        exit(1);
    long long began = now_ns();
    if (read(answers[0], &c, 1) != 1)
        exit(1);
    return now_ns() - began;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    pthread_t writer;
    if (pipe(requests) || pipe(answers) || pthread_create(&writer, NULL, answer, NULL))
        return 1;
    sleep(1);
    long long end = now_ns() + (long long)(seconds * 1e9), blocked = 0;
    while (now_ns() < end) {
        compute(25000000);
        blocked += wait_for_data();
    }
    printf("%lld\n", blocked);
    return 0;
}
