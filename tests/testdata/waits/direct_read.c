/* I/O waits of known length (tests/test_lock_io_waits.py): reads FILE with O_DIRECT (past the page
 * cache: every read goes to the device) in 1 MiB blocks from random offsets in read_from_disk() for
 * SECONDS, measuring the time spent in pread; then sleeps SLEEP_MS in sleep_a_while() (a wait that
 * is not I/O). Prints "read_ns N" (the time in pread), "read_off_cpu_ns N" (of it, the time the
 * thread was not on a CPU: the wall time less the thread's CPU time, which the kernel's share of a
 * 1 MiB read makes 5-15% of it), "reads N" and "sleep_ns N".
 * Usage: direct_read FILE SECONDS */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (1 << 20)
#define SLEEP_MS 500

static long long clock_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* One read; its wall time, and adds its time off the CPU to *off_cpu. */
__attribute__((noinline)) static long long read_from_disk(int fd, void *buffer, off_t blocks, long long *off_cpu) {
    off_t at = (off_t)(rand() % blocks) * BLOCK;
    long long began = now_ns(), cpu_began = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (pread(fd, buffer, BLOCK, at) < 0) {
        perror("pread");
        exit(1);
    }
    long long wall = now_ns() - began;
    *off_cpu += wall - (clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu_began);
    return wall;
}

__attribute__((noinline)) static long long sleep_a_while(void) {
    long long began = now_ns();
    struct timespec pause = {0, SLEEP_MS * 1000000L};
    nanosleep(&pause, NULL);
    return now_ns() - began;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int fd = open(argv[1], O_RDONLY | O_DIRECT);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    struct stat st;
    fstat(fd, &st);
    off_t blocks = st.st_size / BLOCK;
    void *buffer;
    if (blocks < 1 || posix_memalign(&buffer, 4096, BLOCK))
        return 1;
    long long total = 0, off_cpu = 0, reads = 0, end = now_ns() + (long long)(atof(argv[2]) * 1e9);
    for (; now_ns() < end; reads++)
        total += read_from_disk(fd, buffer, blocks, &off_cpu);
    long long slept = sleep_a_while();
    printf("read_ns %lld\nread_off_cpu_ns %lld\nreads %lld\nsleep_ns %lld\n", total, off_cpu, reads, slept);
    return 0;
}
