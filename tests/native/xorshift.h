/* The tests' C programs draw their sizes, slots and keys from xorshift64: reproducible from a
 * seed, and no allocation of its own (rand() may take a lock, and these programs test an
 * allocator wrapper). */
#ifndef TESTS_XORSHIFT_H
#define TESTS_XORSHIFT_H
#include <stdint.h>

static inline uint64_t next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

#endif
