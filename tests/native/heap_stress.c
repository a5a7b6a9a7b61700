/* The heap sampler under threads and fork: THREADS threads malloc, calloc, realloc,
 * posix_memalign and free blocks through shared slots, so a block is often freed or realloc'd by
 * another thread than the one that allocated it; meanwhile the main thread forks FORKS times, and
 * each child allocates, frees and starts a thread of its own before it exits (a lock held across
 * the fork would hang it). Blocks from __libc_malloc, which the sampler never sees, are freed and
 * realloc'd through the wrappers. Every block carries its size and a tag, checked when it is
 * freed. Prints "ok" and exits 0; anything else is a failure.
 * Usage: heap_stress [OPS_PER_THREAD]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "xorshift.h"

#define THREADS 4
#define SLOTS 512
#define FORKS 4

extern void *__libc_malloc(size_t);

static _Atomic(unsigned char *) slots[SLOTS];
static atomic_int corrupt;

struct header {
    size_t size;
    uint64_t tag;
};

static size_t pick_size(uint64_t *s) {
    unsigned bits = 4 + next(s) % 13; /* 16 B to 64 KiB */
    return sizeof(struct header) + 1 + (next(s) & ((1u << bits) - 1));
}

static void stamp(unsigned char *p, size_t size) {
    struct header h = {size, (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull ^ size};
    memcpy(p, &h, sizeof h);
    p[size - 1] = (unsigned char)size;
}

static int intact(const unsigned char *p) {
    struct header h;
    memcpy(&h, p, sizeof h);
    return h.tag == ((uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull ^ h.size) && p[h.size - 1] == (unsigned char)h.size;
}

static void release(unsigned char *p) {
    if (!p) return;
    if (!intact(p)) atomic_fetch_add(&corrupt, 1);
    free(p);
}

static unsigned char *allocate(uint64_t *s) {
    size_t size = pick_size(s);
    unsigned char *p = NULL;
    switch (next(s) % 5) {
    case 0: p = calloc(1, size); break;
    case 1: {
        void *q;
        if (posix_memalign(&q, 64, size) == 0) p = q;
        break;
    }
    case 2: p = __libc_malloc(size); break; /* never seen by the sampler */
    default: p = malloc(size); break;
    }
    if (p) stamp(p, size);
    return p;
}

static void *worker(void *arg) {
    uint64_t s = 0x9e3779b97f4a7c15ull * ((uintptr_t)arg + 1);
    long ops = *(long *)arg;
    for (long i = 0; i < ops; i++) {
        _Atomic(unsigned char *) *slot = &slots[next(&s) % SLOTS];
        unsigned char *p = atomic_exchange(slot, NULL);
        if (p && next(&s) % 3 == 0) {
            if (!intact(p)) atomic_fetch_add(&corrupt, 1);
            struct header h;
            memcpy(&h, p, sizeof h);
            size_t size = pick_size(&s);
            unsigned char *q = realloc(p, size);
            if (q) {
                size_t kept = h.size < size ? h.size : size;
                struct header moved;
                memcpy(&moved, q, sizeof moved);
                if (moved.size != h.size || (kept == h.size && q[kept - 1] != (unsigned char)h.size))
                    atomic_fetch_add(&corrupt, 1);
                stamp(q, size);
                p = q;
            }
        } else {
            release(p);
            p = allocate(&s);
        }
        release(atomic_exchange(slot, p));
    }
    return NULL;
}

static void *child_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < 1000; i++) free(malloc(100 + i));
    return NULL;
}

static void child(void) {
    uint64_t s = 42;
    for (int i = 0; i < 20000; i++) {
        unsigned char *p = allocate(&s);
        unsigned char *q = atomic_exchange(&slots[i % SLOTS], NULL); /* copies of the parent's */
        release(q);
        release(p);
    }
    pthread_t t;
    if (pthread_create(&t, NULL, child_thread, NULL) != 0 || pthread_join(t, NULL) != 0) _exit(3);
    _exit(atomic_load(&corrupt) ? 4 : 0);
}

int main(int argc, char **argv) {
    long ops = argc > 1 ? atol(argv[1]) : 200000;
    pthread_t threads[THREADS];
    long args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = ops;
        if (pthread_create(&threads[i], NULL, worker, &args[i]) != 0) return 10;
    }
    for (int f = 0; f < FORKS; f++) {
        usleep(20000);
        pid_t pid = fork();
        if (pid < 0) return 11;
        if (pid == 0) child();
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child %d: status %d\n", f, status);
            return 12;
        }
    }
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < SLOTS; i++) release(atomic_exchange(&slots[i], NULL));
    if (atomic_load(&corrupt)) {
        fprintf(stderr, "%d blocks corrupt\n", atomic_load(&corrupt));
        return 13;
    }
    puts("ok");
    return 0;
}
