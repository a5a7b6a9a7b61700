/* Threads parked at known places (tests/test_thread_profiles.py): once a line comes on stdin, A
 * threads park in park_in_the_pool and B in park_at_the_door, each in a pthread_cond_wait that no
 * one signals until stdin closes; main waits for them all to be parked, prints "parked N", and
 * waits for stdin's end in wait_for_the_end (polling it, waking every 100 ms: always at the same
 * place), then wakes them and joins them. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;   /* signalled at the end only */
static pthread_cond_t parked_cond = PTHREAD_COND_INITIALIZER;
static int parked, done;
static int in_the_pool, at_the_door;  /* (each site its own: the two functions' code must differ, or gcc folds them into one) */

static void park(int *here)
{
    pthread_mutex_lock(&lock);
    parked++;
    (*here)++;
    pthread_cond_signal(&parked_cond);
    while (!done)
        pthread_cond_wait(&wake, &lock);
    pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) void park_in_the_pool(void) { park(&in_the_pool); __asm__ volatile(""); }
__attribute__((noinline)) void park_at_the_door(void) { park(&at_the_door); __asm__ volatile(""); }

static void *pool_thread(void *arg) { (void)arg; park_in_the_pool(); return NULL; }
static void *door_thread(void *arg) { (void)arg; park_at_the_door(); return NULL; }

__attribute__((noinline)) static void wait_for_the_end(void)
{
    char buffer[64];
    struct pollfd input = {.fd = 0, .events = POLLIN};
    for (;;) {
        if (poll(&input, 1, 100) == 1 && read(0, buffer, sizeof(buffer)) <= 0)
            return;
    }
}

int main(int argc, char **argv)
{
    int pool = argc > 1 ? atoi(argv[1]) : 50, door = argc > 2 ? atoi(argv[2]) : 5;
    pthread_t *threads = calloc(pool + door, sizeof(*threads));
    char line[64];
    if (!fgets(line, sizeof(line), stdin))  /* the go-ahead */
        return 1;
    for (int i = 0; i < pool + door; i++)
        pthread_create(&threads[i], NULL, i < pool ? pool_thread : door_thread, NULL);
    pthread_mutex_lock(&lock);
    while (parked < pool + door)
        pthread_cond_wait(&parked_cond, &lock);
    pthread_mutex_unlock(&lock);
    printf("parked %d\n", parked);
    fflush(stdout);
    wait_for_the_end();
    pthread_mutex_lock(&lock);
    done = 1;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < pool + door; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
