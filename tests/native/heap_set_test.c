/* The heap sampler's set of sampled blocks (sdk/native/sampled_set.h), alone, against a plain
 * array of what it should hold:
 *  1. runs that wrap around the end of the table: 120 keys whose home is one of the last four of
 *     512 slots, removed in random order (backward shifts across the end), every key checked
 *     after each removal;
 *  2. random adds and removes (the table doubling past 1/4 full), each touched key checked, all
 *     keys every 1,000 operations;
 *  3. readers probing without the lock while a writer adds and removes keys of the same run of
 *     slots, shifting the readers' keys: a key a reader owns is always found (maybe_tracked never
 *     says "no" for a member, its filter bit included, while the writer sets and clears the bits
 *     of other buckets of the same words);
 *  4. the filter in front of the table: a bit set exactly for the buckets of members (checked
 *     with test 2's), none left set once the set is empty.
 * Prints "ok"; anything else is a failure. Build: gcc -O2 -pthread -I sdk/native. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampled_set.h"
#include "xorshift.h"

static int failures;

#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) {                            \
            if (failures++ < 10) {                \
                fprintf(stderr, __VA_ARGS__);     \
                fputc('\n', stderr);              \
            }                                     \
        }                                         \
    } while (0)

static int contains(uintptr_t p) {
    struct table *t = atomic_load(&table);
    return t && probe(t, p);
}

static void wrapping_runs(void) {
    uintptr_t keys[120];
    int n = 0;
    sampled_add(16); /* the first table: 512 slots */
    sampled_remove(16);
    struct table *t = atomic_load(&table);
    CHECK(t->mask == 511, "expected 512 slots, got %zu", t->mask + 1);
    for (uintptr_t p = 32; n < 120; p += 16)
        if (home(t, p) >= 508) keys[n++] = p;
    for (int i = 0; i < n; i++) CHECK(sampled_add(keys[i]), "add failed");
    CHECK(atomic_load(&table) == t, "the table grew: the test needs it to stay at 512");
    uint64_t s = 7;
    for (int i = n - 1; i > 0; i--) { /* shuffle */
        int j = (int)(next(&s) % (uint64_t)(i + 1));
        uintptr_t k = keys[i];
        keys[i] = keys[j];
        keys[j] = k;
    }
    for (int i = 0; i < n; i++) {
        CHECK(sampled_remove(keys[i]), "remove of a member %lx failed", (unsigned long)keys[i]);
        CHECK(!sampled_remove(keys[i]), "second remove of %lx succeeded", (unsigned long)keys[i]);
        for (int j = 0; j < n; j++)
            CHECK(contains(keys[j]) == (j > i), "after %d removes: key %d %s", i + 1, j, j > i ? "lost" : "still there");
    }
    CHECK(sampled_count() == 0, "count %zu after removing all", sampled_count());
}

#define KEYS 20000

/* Whether each filter bit is set exactly when a member's bucket is it. */
static int filter_is_of(const unsigned char *member) {
    static uint32_t expected[FILTER_BITS];
    memset(expected, 0, sizeof expected);
    for (size_t j = 0; j < KEYS; j++)
        if (member[j]) expected[bucket(0x10000 + 16 * (uintptr_t)j)]++;
    for (size_t b = 0; b < FILTER_BITS; b++)
        if (expected[b] != filter_counts[b] || (int)((atomic_load(&filter[b / 64]) >> (b % 64)) & 1) != (expected[b] > 0)) return 0;
    return 1;
}

static void random_operations(void) {
    static unsigned char member[KEYS];
    uint64_t s = 12345;
    size_t count = 0;
    for (int op = 0; op < 400000; op++) {
        size_t k = next(&s) % KEYS;
        uintptr_t p = 0x10000 + 16 * (uintptr_t)k;
        if (member[k]) {
            CHECK(sampled_remove(p), "op %d: member %zu not removed", op, k);
            member[k] = 0;
            count--;
        } else if (next(&s) % 3) {
            CHECK(sampled_add(p), "op %d: add failed", op);
            member[k] = 1;
            count++;
        } else {
            CHECK(!sampled_remove(p), "op %d: non-member %zu removed", op, k);
        }
        CHECK(contains(p) == member[k], "op %d: key %zu", op, k);
        CHECK(!member[k] || maybe_tracked(p), "op %d: member %zu not in the filter", op, k);
        if (op % 1000 == 0) {
            for (size_t j = 0; j < KEYS; j++) CHECK(contains(0x10000 + 16 * (uintptr_t)j) == member[j], "op %d: key %zu of all", op, j);
            CHECK(sampled_count() == count, "op %d: count %zu, expected %zu", op, sampled_count(), count);
            CHECK(filter_is_of(member), "op %d: the filter is not the members'", op);
        }
    }
    for (size_t j = 0; j < KEYS; j++)
        if (member[j]) sampled_remove(0x10000 + 16 * (uintptr_t)j);
}

#define READERS 2
#define OWNED 64
#define CONTENDED 200
static atomic_int stop;
static uintptr_t owned[READERS][OWNED], contended[CONTENDED];

/* Keys whose home is one of 32 neighbouring slots: they make one long run, so the writer's
 * removals shift the readers' keys along it while they are looked for. */
static void pick_colliding_keys(void) {
    struct table *t = atomic_load(&table);
    int n = 0;
    for (uintptr_t p = 0x40000000; n < READERS * OWNED + CONTENDED; p += 16) {
        size_t h = home(t, p);
        if (h < 100 || h >= 132) continue;
        if (n < READERS * OWNED) owned[n / OWNED][n % OWNED] = p;
        else contended[n - READERS * OWNED] = p;
        n++;
    }
}

static void *reader(void *arg) {
    uintptr_t *keys = owned[(uintptr_t)arg];
    for (int i = 0; i < OWNED; i++) sampled_add(keys[i]);
    long rounds = 0;
    while (!atomic_load(&stop)) {
        for (int i = 0; i < OWNED; i++)
            CHECK(maybe_tracked(keys[i]), "reader %ld: own key %d not found", (long)(uintptr_t)arg, i);
        rounds++;
    }
    for (int i = 0; i < OWNED; i++) CHECK(sampled_remove(keys[i]), "reader: own key %d not removed", i);
    return (void *)rounds;
}

static void readers_while_writing(void) {
    pick_colliding_keys();
    pthread_t threads[READERS];
    for (long i = 0; i < READERS; i++) pthread_create(&threads[i], NULL, reader, (void *)i);
    uint64_t s = 99;
    for (int op = 0; op < 300000; op++) {
        uintptr_t p = contended[next(&s) % CONTENDED];
        if (!sampled_remove(p)) sampled_add(p);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < READERS; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < CONTENDED; i++) sampled_remove(contended[i]);
}

int main(void) {
    wrapping_runs();
    random_operations();
    readers_while_writing();
    CHECK(sampled_count() == 0, "%zu left in the set", sampled_count());
    for (size_t w = 0; w < FILTER_BITS / 64; w++) CHECK(atomic_load(&filter[w]) == 0, "filter word %zu left set with the set empty", w);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    puts("ok");
    return 0;
}
