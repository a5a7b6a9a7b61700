/* What the malloc family tells a program, printed one fact a line, so a test can check the sampler
 * changes none of it (run it with and without the library, and with every allocation sampled):
 * errno kept on success and set on failure, invalid alignments, overflowing calloc, realloc to 0,
 * malloc_usable_size, free(NULL), C++-style aligned sizes. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOW(name, value) printf("%s %ld\n", name, (long)(value))

int main(void) {
    void *p, *q;
    int rc;

    errno = 1234;
    p = malloc(100);
    SHOW("malloc_errno_kept", errno == 1234);
    SHOW("usable_at_least", malloc_usable_size(p) >= 100);
    SHOW("usable_100", malloc_usable_size(p));
    errno = 1234;
    free(p);
    SHOW("free_errno_kept", errno == 1234);
    errno = 1234;
    free(NULL);
    SHOW("free_null_errno_kept", errno == 1234);

    errno = 0;
    p = malloc(SIZE_MAX - 4096);
    SHOW("huge_malloc_null", p == NULL);
    SHOW("huge_malloc_errno", errno);
    errno = 0;
    p = calloc(SIZE_MAX / 2, 3);
    SHOW("calloc_overflow_null", p == NULL);
    SHOW("calloc_overflow_errno", errno);

    p = malloc(1000);
    memset(p, 7, 1000);
    errno = 0;
    q = realloc(p, SIZE_MAX - 4096);
    SHOW("huge_realloc_null", q == NULL);
    SHOW("huge_realloc_errno", errno);
    SHOW("huge_realloc_kept_old", ((unsigned char *)p)[999] == 7);
    errno = 1234;
    q = realloc(p, 0); /* glibc frees and returns NULL */
    SHOW("realloc_zero_null", q == NULL);
    SHOW("realloc_zero_errno_kept", errno == 1234);
    free(q);

    p = (void *)0x1;
    errno = 1234;
    rc = posix_memalign(&p, 24, 100);
    SHOW("posix_memalign_bad_rc", rc);
    SHOW("posix_memalign_bad_untouched", p == (void *)0x1);
    SHOW("posix_memalign_bad_errno_kept", errno == 1234);
    rc = posix_memalign(&p, 1 << 16, 3000);
    SHOW("posix_memalign_64k_rc", rc);
    SHOW("posix_memalign_64k_aligned", ((uintptr_t)p & 0xffff) == 0);
    SHOW("posix_memalign_usable", malloc_usable_size(p) >= 3000);
    free(p);

    errno = 0;
    p = aligned_alloc(24, 48);
    SHOW("aligned_alloc_bad_null", p == NULL);
    SHOW("aligned_alloc_bad_errno", errno);
    free(p);
    p = aligned_alloc(4096, 8192);
    SHOW("aligned_alloc_aligned", ((uintptr_t)p & 4095) == 0);
    free(p);
    p = memalign(256, 10);
    SHOW("memalign_aligned", ((uintptr_t)p & 255) == 0);
    free(p);
    p = valloc(10);
    SHOW("valloc_aligned", ((uintptr_t)p & ((uintptr_t)sysconf(_SC_PAGESIZE) - 1)) == 0);
    free(p);

    p = calloc(1000, 1000);
    int zero = 1;
    for (int i = 0; i < 1000000; i++) zero &= ((unsigned char *)p)[i] == 0;
    SHOW("calloc_zero", zero);
    free(p);

    errno = 0;
    p = reallocarray(NULL, SIZE_MAX / 2, 3);
    SHOW("reallocarray_overflow_null", p == NULL);
    SHOW("reallocarray_overflow_errno", errno);
    p = reallocarray(NULL, 10, 10);
    SHOW("reallocarray_usable", malloc_usable_size(p) >= 100);
    free(p);

    p = malloc(0);
    SHOW("malloc_zero_not_null", p != NULL);
    free(p);
    return 0;
}
