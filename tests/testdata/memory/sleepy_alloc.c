/* A process that allocates while it sleeps (test_memory_profiling's exec test): COUNT times,
 * sleepy_allocate() mallocs and frees a 64 KiB block, then the process sleeps 100 ms: it is
 * almost never on a CPU, so no CPU sample announces it. Prints "allocated COUNT".
 * Usage: sleepy_alloc COUNT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void sleepy_allocate(void) {
    char *p = malloc(65536);
    memset(p, 1, 64);
    sink += (unsigned long)p;
    free(p);
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 20;
    for (int i = 0; i < count; i++) {
        sleepy_allocate();
        struct timespec pause = {0, 100000000};
        nanosleep(&pause, NULL);
    }
    printf("allocated %d\n", count);
    return 0;
}
