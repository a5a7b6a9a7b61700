/* Lock waits of known length (tests/test_lock_io_waits.py): THREADS threads take one pthread mutex
 * in turn, each holding it for HOLD_MS in hold_the_lock() (asleep, the lock held), for SECONDS; each
 * measures the time it spends in pthread_mutex_lock in wait_for_the_lock(). Then the main thread
 * waits COND_MS on a condition variable in wait_for_the_signal(), which a helper signals after
 * sleeping that long. Prints "mutex_wait_ns N" (all threads' waits) and "condvar_wait_ns N".
 * It spins a second first: the profiler announces it and reads its files (libc's unwind rows,
 * without which a wait's stack ends in libc) before the first wait. With a second argument
 * "wait", it then reads a line from its standard input before the threads start (another tracer
 * attaching meanwhile: tests/test_lock_wakers.py).
 * Usage: lock_contention SECONDS [wait] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREADS 4
#define HOLD_MS 5
#define COND_MS 400

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t signal_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t signalled = PTHREAD_COND_INITIALIZER;
static int ready;
static double seconds;
static long long waited_ns[THREADS];

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void pause_ms(long ms) {
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&pause, NULL);
}

__attribute__((noinline)) static long long wait_for_the_lock(void) {
    long long began = now_ns();
    pthread_mutex_lock(&lock);
    return now_ns() - began;
}

__attribute__((noinline)) static void hold_the_lock(void) {
    pause_ms(HOLD_MS);
    pthread_mutex_unlock(&lock);
    __asm__ volatile("" ::: "memory");  /* (not a tail call: the unlock, and its wake, stay in this frame) */
}

static void *contend(void *arg) {
    long index = (long)arg;
    long long end = now_ns() + (long long)(seconds * 1e9);
    while (now_ns() < end) {
        waited_ns[index] += wait_for_the_lock();
        hold_the_lock();
    }
    return NULL;
}

static void *signal_later(void *arg) {
    (void)arg;
    pause_ms(COND_MS);
    pthread_mutex_lock(&signal_lock);
    ready = 1;
    pthread_cond_signal(&signalled);
    pthread_mutex_unlock(&signal_lock);
    return NULL;
}

__attribute__((noinline)) static long long wait_for_the_signal(void) {
    pthread_t signaller;
    pthread_create(&signaller, NULL, signal_later, NULL);
    long long began = now_ns();
    pthread_mutex_lock(&signal_lock);
    while (!ready)
        pthread_cond_wait(&signalled, &signal_lock);
    pthread_mutex_unlock(&signal_lock);
    long long waited = now_ns() - began;
    pthread_join(signaller, NULL);
    return waited;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 3;
    for (long long end = now_ns() + 1000000000LL; now_ns() < end;)
        ;
    if (argc > 2 && strcmp(argv[2], "wait") == 0) {
        char line[16];
        if (!fgets(line, sizeof(line), stdin))
            return 1;
    }
    pthread_t threads[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, contend, (void *)i);
    long long total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        total += waited_ns[i];
    }
    long long condvar = wait_for_the_signal();
    printf("mutex_wait_ns %lld\ncondvar_wait_ns %lld\n", total, condvar);
    return 0;
}
