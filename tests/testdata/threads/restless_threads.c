/* A hostile process for the threads profile (tests/test_thread_profiles.py): THREADS threads that
 * never leave a CPU twice at one place (each sleeps 1 ms at a call depth that changes every
 * time), so that every switch of each asks for a walk, until stdin closes. Prints "running N". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile int done;

__attribute__((noinline)) static void nap(int depth)
{
    if (depth > 0) {
        nap(depth - 1);
        __asm__ volatile("");
        return;
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
}

static void *restless(void *arg)
{
    unsigned depth = (unsigned)(long)arg;
    while (!done)
        nap(depth++ % 16);
    return NULL;
}

int main(int argc, char **argv)
{
    int count = argc > 1 ? atoi(argv[1]) : 1000;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 << 10);
    pthread_t *threads = calloc(count, sizeof(*threads));
    int made = 0;
    for (; made < count; made++)
        if (pthread_create(&threads[made], &attr, restless, (void *)(long)made))
            break;
    printf("running %d\n", made);
    fflush(stdout);
    char buffer[64];
    while (read(0, buffer, sizeof(buffer)) > 0)
        ;
    done = 1;
    for (int i = 0; i < made; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
