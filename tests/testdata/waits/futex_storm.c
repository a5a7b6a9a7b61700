/* A hostile process's futex waits (tests/test_hostile_waits.py): PAIRS pairs of threads hand a
 * turn back and forth through one futex word each, as fast as the CPUs let them: every hand-over
 * is a FUTEX_WAIT that sleeps and a FUTEX_WAKE, every wait a switch off a CPU in a futex wait
 * (what lock_profiling records, up to its budget). For SECONDS, then prints to stderr
 * "sleeping_waits N" and "seconds S". (A FUTEX_WAIT that returns at once, its value changed or
 * its timeout past, never leaves the CPU: the switch program never sees it, and it is only a
 * thread burning a CPU.)
 * Usage: futex_storm SECONDS */
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAIRS 4

struct pair {
    _Atomic int turn;
    char pad[60];
};

static struct pair pairs[PAIRS];
static _Atomic int stop;
static _Atomic long sleeping_waits;

static long futex(_Atomic int *word, int op, int value, const struct timespec *timeout) {
    return syscall(SYS_futex, word, op, value, timeout, NULL, 0);
}

struct side {
    struct pair *pair;
    int me;
};

__attribute__((noinline)) static void hand_over(struct pair *pair, int me) {
    int other = !me;
    const struct timespec tick = {0, 10 * 1000 * 1000};  /* (so a stop is seen) */
    while (atomic_load(&pair->turn) != me && !atomic_load(&stop)) {
        if (futex(&pair->turn, FUTEX_WAIT_PRIVATE, other, &tick) == 0)
            atomic_fetch_add_explicit(&sleeping_waits, 1, memory_order_relaxed);
    }
    atomic_store(&pair->turn, other);
    futex(&pair->turn, FUTEX_WAKE_PRIVATE, 1, NULL);
}

static void *play(void *arg) {
    struct side *side = arg;
    while (!atomic_load(&stop))
        hand_over(side->pair, side->me);
    return NULL;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    pthread_t threads[2 * PAIRS];
    static struct side sides[2 * PAIRS];
    int n = 0;
    for (int i = 0; i < PAIRS; i++)
        for (int me = 0; me < 2; me++) {
            sides[2 * i + me] = (struct side){&pairs[i], me};
            pthread_create(&threads[n++], NULL, play, &sides[2 * i + me]);
        }
    struct timespec pause = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&pause, NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < PAIRS; i++)
        futex(&pairs[i].turn, FUTEX_WAKE_PRIVATE, 2, NULL);
    for (int i = 0; i < n; i++)
        pthread_join(threads[i], NULL);
    fprintf(stderr, "sleeping_waits %ld\nseconds %g\n", (long)sleeping_waits, seconds);
    return 0;
}
