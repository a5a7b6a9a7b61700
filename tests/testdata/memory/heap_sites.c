/* Three named allocation sites for memory profiles built without BPF (tests/heap_profiles.py):
 * run under the native heap sampler (LD_PRELOAD), so the sampler's own frames (sample,
 * malloc_sampled, malloc) are mapped where the profiler finds them, and blocked on stdin (it burns
 * no CPU) until the test closes it. It prints "ready" once it runs. */
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) void *alloc_hot(size_t n) { return malloc(n); }
__attribute__((noinline)) void *alloc_warm(size_t n) { return malloc(n); }
__attribute__((noinline)) void *alloc_leaky(size_t n) { return malloc(n); }

int main(void) {
    char c;
    if (write(1, "ready\n", 6) != 6) return 1;
    if (read(0, &c, 1) < 0) return 1;
    free(alloc_hot(16));
    free(alloc_warm(16));
    free(alloc_leaky(16));
    return 0;
}
