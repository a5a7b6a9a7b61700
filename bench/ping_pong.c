/* The off-CPU bench's workload: two processes bounce one byte over two pipes as fast as they
 * can for SECONDS, then the parent prints "ROUND_TRIPS SECONDS".  Both are pinned to CPU: each
 * round trip blocks each process once in read() and the CPU switches straight from one to the
 * other, two context switches a round trip and little else, the most a profiler's program on
 * the context switch can cost a workload.  Unpinned, the scheduler puts the two on one CPU or
 * on two (where each wake-up is an interrupt to an idle CPU, ten times slower on a VM) and
 * flips between the two from run to run.
 *
 * With "futex" after CPU, the two bounce a turn through one futex word in a shared page instead
 * (each waits in FUTEX_WAIT, not in read()): every switch off the CPU is then a lock wait, what
 * lock_profiling records.
 *
 * usage: ping_pong SECONDS [CPU [futex]]   (unpinned without CPU)
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The child: echo every byte back until the parent closes its end. */
static int pong(int in, int out)
{
    char byte;
    while (read(in, &byte, 1) == 1)
        if (write(out, &byte, 1) != 1)
            return 1;
    return 0;
}

/* The parent: send, wait for the echo; read the clock every 256 round trips, not every one. */
static long ping(int out, int in, double seconds, double *elapsed)
{
    char byte = 0;
    long trips = 0;
    double began = now(), end = began + seconds, t = began;
    while (t < end) {
        for (int i = 0; i < 256; i++) {
            if (write(out, &byte, 1) != 1 || read(in, &byte, 1) != 1)
                return -1;
        }
        trips += 256;
        t = now();
    }
    *elapsed = t - began;
    return trips;
}

/* futex mode: whose turn it is (0 the parent's, 1 the child's, 2 the end), in a shared page. */
static void futex_wait_while(_Atomic int *turn, int value)
{
    while (atomic_load(turn) == value)
        syscall(SYS_futex, turn, FUTEX_WAIT, value, NULL, NULL, 0);
}

static void futex_hand(_Atomic int *turn, int to)
{
    atomic_store(turn, to);
    syscall(SYS_futex, turn, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static int futex_pong(_Atomic int *turn)
{
    for (;;) {
        futex_wait_while(turn, 0);
        if (atomic_load(turn) == 2)
            return 0;
        futex_hand(turn, 0);
    }
}

static long futex_ping(_Atomic int *turn, double seconds, double *elapsed)
{
    long trips = 0;
    double began = now(), end = began + seconds, t = began;
    while (t < end) {
        for (int i = 0; i < 256; i++) {
            futex_hand(turn, 1);
            futex_wait_while(turn, 1);
        }
        trips += 256;
        t = now();
    }
    *elapsed = t - began;
    futex_hand(turn, 2);
    return trips;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4 || (argc == 4 && strcmp(argv[3], "futex") != 0)) {
        fprintf(stderr, "usage: %s SECONDS [CPU [futex]]\n", argv[0]);
        return 2;
    }
    if (argc >= 3) {
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        CPU_SET(atoi(argv[2]), &cpus);
        if (sched_setaffinity(0, sizeof(cpus), &cpus)) {  /* before fork: the child inherits it */
            perror("sched_setaffinity");
            return 1;
        }
    }
    if (argc == 4) {
        _Atomic int *turn = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (turn == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        pid_t child = fork();
        if (child < 0) {
            perror("fork");
            return 1;
        }
        if (child == 0)
            return futex_pong(turn);
        double elapsed = 0;
        long trips = futex_ping(turn, atof(argv[1]), &elapsed);
        int status;
        if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "ping_pong: the bounce failed\n");
            return 1;
        }
        printf("%ld %.6f\n", trips, elapsed);
        return 0;
    }
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) {
        perror("pipe");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        return pong(to_child[0], to_parent[1]);
    }
    close(to_child[0]);
    close(to_parent[1]);
    double elapsed = 0;
    long trips = ping(to_child[1], to_parent[0], atof(argv[1]), &elapsed);
    close(to_child[1]);  /* the child reads EOF and exits */
    int status;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || trips < 0) {
        fprintf(stderr, "ping_pong: the bounce failed\n");
        return 1;
    }
    printf("%ld %.6f\n", trips, elapsed);
    return 0;
}
