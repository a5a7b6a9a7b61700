/* A program that runs in two spans, as an instrumented service would: spin_heavy (3/4 of its
 * work) inside span 0x11..., spin_light inside span 0x22..., both of trace 0xab... It publishes
 * them through otel_thread_ctx.c's writer, which is linked in (the library, or compiled into this
 * executable), or, with "dlopen PATH", loaded at run time.
 *
 *   otel_thread_ctx_main SECONDS [dlopen PATH]
 *
 * It prints, once the first record is attached: "tp=<thread pointer> var=<&otel_thread_ctx_v1>".
 * With OTEL_CTX_PAYLOAD set (an encoded Resource, in hex), it first publishes that as its process
 * context (OTEP 4719), in a memfd named OTEL_CTX, as an SDK does. With OTEL_CTX_GARBAGE set (and
 * the writer linked in), the variable points into unmapped memory while spin_heavy runs. With
 * OTEL_CTX_SLEEP set, it sleeps in the heavy span instead of working. With OTEL_CTX_ALLOCATE set,
 * it also allocates in each span, 48 KiB in the heavy one (allocate_heavy) for 16 KiB in the
 * light one (allocate_light), freed at once: what a heap sampler sees. With OTEL_CTX_LIE_SIZE set,
 * its process context's header says the payload takes 2 GiB. With OTEL_CTX_DLOPEN_LATE
 * set (seconds), it works that long between publishing its process context and the dlopen, so
 * that the agent reads its maps before the writer is there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*attach_fn)(const uint8_t *, const uint8_t *, uint8_t, const uint8_t *, uint16_t);
typedef long (*offset_fn)(void);
#ifndef DLOPEN_ONLY
void otel_ctx_attach(const uint8_t *, const uint8_t *, uint8_t, const uint8_t *, uint16_t);
long otel_ctx_tp_offset(void);
void otel_ctx_set_raw(void *);  /* (not the variable itself: a reference from here would add a relocation) */
void otel_ctx_set_attrs_size(uint16_t);
#endif

volatile uint64_t sink;
__attribute__((noinline)) void spin_heavy(void) { for (int i = 0; i < 300000; i++) sink += i * 7; }
__attribute__((noinline)) void spin_light(void) { for (int i = 0; i < 100000; i++) sink += i * 3; }
__attribute__((noinline)) void allocate_heavy(void)
{
    for (int i = 0; i < 3; i++) {
        volatile char *block = malloc(16384);
        block[0] = 1;
        free((void *)block);
    }
}
__attribute__((noinline)) void allocate_light(void)
{
    volatile char *block = malloc(16384);
    block[0] = 1;
    free((void *)block);
}

static void publish_process_context(const char *hex)
{
    size_t size = strlen(hex) / 2;
    int fd = memfd_create("OTEL_CTX", 0);
    if (fd < 0 || ftruncate(fd, 4096 + size) != 0)
        return;
    uint8_t *region = mmap(NULL, 4096 + size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (region == MAP_FAILED)
        return;
    madvise(region, 4096 + size, MADV_DONTFORK);
    for (size_t i = 0; i < size; i++)
        sscanf(hex + 2 * i, "%2hhx", &region[64 + i]);
    struct { char signature[8]; uint32_t version, payload_size; uint64_t published_at_ns; uint8_t *payload; } header = {
        {0}, 2, getenv("OTEL_CTX_LIE_SIZE") ? 0x7fffffffu : (uint32_t)size, 0, region + 64};
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    header.published_at_ns = t.tv_sec * 1000000000ull + t.tv_nsec;
    memcpy(region + 8, (char *)&header + 8, sizeof(header) - 8);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    memcpy(region, "OTEL_CTX", 8);  /* the signature last */
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void warm_up(double seconds)
{
    for (double end = now() + seconds; now() < end;)
        for (int i = 0; i < 100000; i++)
            sink += i;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    if (getenv("OTEL_CTX_PAYLOAD"))
        publish_process_context(getenv("OTEL_CTX_PAYLOAD"));
    attach_fn attach = NULL;
    offset_fn tp_offset = NULL;
#ifndef DLOPEN_ONLY
    attach = otel_ctx_attach;
    tp_offset = otel_ctx_tp_offset;
#endif
    if (getenv("OTEL_CTX_DLOPEN_LATE"))
        warm_up(atof(getenv("OTEL_CTX_DLOPEN_LATE")));
    if (argc > 3 && !strcmp(argv[2], "dlopen")) {
        void *library = dlopen(argv[3], RTLD_NOW);
        if (!library) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        attach = (attach_fn)dlsym(library, "otel_ctx_attach");
        tp_offset = (offset_fn)dlsym(library, "otel_ctx_tp_offset");
    }
    if (!attach || !tp_offset) {
        fprintf(stderr, "no writer: built with DLOPEN_ONLY, run it with dlopen PATH\n");
        return 1;
    }
    uint8_t trace[16], heavy[8], light[8];
    memset(trace, 0xab, sizeof(trace));
    memset(heavy, 0x11, sizeof(heavy));
    memset(light, 0x22, sizeof(light));
    /* attributes: key 0 ("http.route" in the tests' key map) = "/heavy" or "/light" */
    const uint8_t heavy_attrs[] = {0, 6, '/', 'h', 'e', 'a', 'v', 'y'}, light_attrs[] = {0, 6, '/', 'l', 'i', 'g', 'h', 't'};
    attach(trace, heavy, 1, heavy_attrs, sizeof(heavy_attrs));
    char *tp = __builtin_thread_pointer();
    printf("tp=%lx var=%lx\n", (unsigned long)tp, (unsigned long)(tp + tp_offset()));
    fflush(stdout);
    /* OTEL_CTX_GARBAGE: a hostile publisher, whose variable points into unmapped memory while
     * spin_heavy runs ("pointer"), or whose record says its attributes take 65535 bytes ("size"). */
#ifndef DLOPEN_ONLY
    const char *garbage = getenv("OTEL_CTX_GARBAGE");
    int garbage_size = garbage && !strcmp(garbage, "size");
#endif
    double end = now() + seconds;
    if (getenv("OTEL_CTX_SLEEP")) {  /* off the CPU inside the heavy span: 10 ms sleeps */
        struct timespec pause = {0, 10 * 1000 * 1000};
        while (now() < end) {
            attach(trace, heavy, 1, heavy_attrs, sizeof(heavy_attrs));
            nanosleep(&pause, NULL);
        }
        return 0;
    }
    int allocate = getenv("OTEL_CTX_ALLOCATE") != NULL;
    while (now() < end) {
        attach(trace, heavy, 1, heavy_attrs, sizeof(heavy_attrs));
#ifndef DLOPEN_ONLY
        if (garbage_size)
            otel_ctx_set_attrs_size(0xffff);
        else if (garbage)
            otel_ctx_set_raw((void *)0x1000);
#endif
        spin_heavy();
        if (allocate)
            allocate_heavy();
        attach(trace, light, 1, light_attrs, sizeof(light_attrs));
        spin_light();
        if (allocate)
            allocate_light();
    }
    return 0;
}
