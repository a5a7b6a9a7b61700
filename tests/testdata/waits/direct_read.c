/* I/O waits of known length (tests/test_lock_io_waits.py): reads FILE with O_DIRECT (past the page
 * cache: every read goes to the device) in 1 MiB blocks from random offsets in read_from_disk() for
 * SECONDS, measuring the time spent in pread; then sleeps SLEEP_MS in sleep_a_while() (a wait that
 * is not I/O). Prints "read_ns N" and "sleep_ns N".
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

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

__attribute__((noinline)) static long long read_from_disk(int fd, void *buffer, off_t blocks) {
    off_t at = (off_t)(rand() % blocks) * BLOCK;
    long long began = now_ns();
    if (pread(fd, buffer, BLOCK, at) < 0) {
        perror("pread");
        exit(1);
    }
    return now_ns() - began;
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
    long long total = 0, end = now_ns() + (long long)(atof(argv[2]) * 1e9);
    while (now_ns() < end)
        total += read_from_disk(fd, buffer, blocks);
    long long slept = sleep_a_while();
    printf("read_ns %lld\nsleep_ns %lld\n", total, slept);
    return 0;
}
