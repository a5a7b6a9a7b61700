/* The native half of the writer: what an out-of-process reader (an eBPF profiler) can find.
 *
 * - The thread context (OTEP 4947): the TLS variable otel_thread_ctx_v1, exported in .dynsym,
 *   points at the running thread's record (trace id, span id, flags, attributes). This module is
 *   dlopen()ed by the interpreter, so the variable lives in dynamic TLS: built with TLS
 *   descriptors (-mtls-dialect=gnu2 on x86-64) as the OTEP recommends, a reader finds it through
 *   the thread's DTV, or at a fixed offset once the descriptor resolved it to static TLS.
 * - The process context (OTEP 4719): a region named OTEL_CTX (a memfd, or an anonymous mapping
 *   named by prctl where memfd_create is refused) whose header points at the encoded resource.
 *
 * Both are written so that a reader that stops this thread (or reads from another CPU) at any
 * instruction sees a whole record or none: the record is written while the variable is NULL
 * (the reader ignores it), the header's publication time is 0 while a payload changes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ thread context (OTEP 4947) */

#define ATTRS_CAPACITY 612 /* the record is 640 bytes, as the OTEP's reference writers lay it out */

struct __attribute__((packed)) otel_thread_ctx_record {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t valid;
    uint8_t trace_flags;
    uint16_t attrs_data_size;
    uint8_t attrs_data[ATTRS_CAPACITY];
};

__attribute__((visibility("default"))) __thread struct otel_thread_ctx_record *otel_thread_ctx_v1;
static __thread struct otel_thread_ctx_record thread_record __attribute__((aligned(8)));

static PyObject *set_span(PyObject *self, PyObject *args)
{
    Py_buffer trace_id, span_id, attrs;
    unsigned char flags;
    if (!PyArg_ParseTuple(args, "y*y*by*:set_span", &trace_id, &span_id, &flags, &attrs))
        return NULL;
    PyObject *result = NULL;
    if (trace_id.len != 16 || span_id.len != 8) {
        PyErr_SetString(PyExc_ValueError, "set_span: a trace id is 16 bytes, a span id 8");
        goto done;
    }
    if (attrs.len > ATTRS_CAPACITY) {
        PyErr_Format(PyExc_ValueError, "set_span: attributes take %zd bytes, a record holds %d", attrs.len, ATTRS_CAPACITY);
        goto done;
    }
    otel_thread_ctx_v1 = NULL; /* a reader sees no span while the record changes */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    memcpy(thread_record.trace_id, trace_id.buf, 16);
    memcpy(thread_record.span_id, span_id.buf, 8);
    thread_record.trace_flags = flags;
    memcpy(thread_record.attrs_data, attrs.buf, attrs.len);
    thread_record.attrs_data_size = (uint16_t)attrs.len;
    thread_record.valid = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    otel_thread_ctx_v1 = &thread_record;
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&trace_id);
    PyBuffer_Release(&span_id);
    PyBuffer_Release(&attrs);
    return result;
}

static PyObject *clear_span(PyObject *self, PyObject *unused)
{
    otel_thread_ctx_v1 = NULL;
    Py_RETURN_NONE;
}

/* Where the variable is from the thread pointer, and where its record is: for the tests, which
 * check that a reader computes the same. */
static PyObject *thread_context_address(PyObject *self, PyObject *unused)
{
    return PyLong_FromVoidPtr((void *)&otel_thread_ctx_v1);
}

/* ------------------------------------------------------------------ process context (OTEP 4719) */

#define MAX_PAYLOAD (64 << 10)          /* what readers accept */
#define PAYLOAD_AT(area) (64 + (area) * MAX_PAYLOAD)
#define REGION_SIZE (64 + 2 * MAX_PAYLOAD) /* header, then two payload areas: an update writes the idle one */
#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif

struct __attribute__((packed)) process_ctx_header {
    char signature[8];
    uint32_t version;
    uint32_t payload_size;
    uint64_t published_at_ns;
    uint64_t payload;
};

static uint8_t *region; /* NULL until published, and in a child after fork (MADV_DONTFORK) */
static int area;
static pthread_mutex_t publish_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint8_t *map_region(void)
{
    uint8_t *mapped = MAP_FAILED;
    int fd = (int)syscall(SYS_memfd_create, "OTEL_CTX", 1u /* MFD_CLOEXEC */);
    if (fd >= 0) {
        if (ftruncate(fd, REGION_SIZE) == 0)
            mapped = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (mapped == MAP_FAILED) { /* memfd refused (a seccomp profile): an anonymous mapping, named */
        mapped = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED)
            return NULL;
        prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)mapped, REGION_SIZE, "OTEL_CTX");
    }
    madvise(mapped, REGION_SIZE, MADV_DONTFORK); /* a child publishes its own, or none */
    return mapped;
}

static void forget_region_in_child(void)
{
    region = NULL; /* not mapped in the child: the next publish maps a new one */
    area = 0;
    pthread_mutex_init(&publish_lock, NULL);
}

static PyObject *publish(PyObject *self, PyObject *args)
{
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "y*:publish", &payload))
        return NULL;
    if (payload.len > MAX_PAYLOAD) {
        PyErr_Format(PyExc_ValueError, "publish: the resource takes %zd bytes, readers accept %d", payload.len, MAX_PAYLOAD);
        PyBuffer_Release(&payload);
        return NULL;
    }
    pthread_mutex_lock(&publish_lock);
    struct process_ctx_header *header;
    if (region == NULL) {
        region = map_region();
        if (region == NULL) {
            pthread_mutex_unlock(&publish_lock);
            PyBuffer_Release(&payload);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        header = (struct process_ctx_header *)region;
        memcpy(region + PAYLOAD_AT(0), payload.buf, payload.len);
        header->version = 2;
        header->payload_size = (uint32_t)payload.len;
        header->payload = (uint64_t)(uintptr_t)(region + PAYLOAD_AT(0));
        header->published_at_ns = now_ns();
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        memcpy(header->signature, "OTEL_CTX", 8); /* the signature last: a reader sees all or nothing */
    } else { /* an update: the time is 0 while it is under way, the new payload goes to the idle area */
        header = (struct process_ctx_header *)region;
        __atomic_store_n(&header->published_at_ns, 0, __ATOMIC_SEQ_CST);
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* (a store alone is a release: later stores could pass it) */
        area = 1 - area;
        memcpy(region + PAYLOAD_AT(area), payload.buf, payload.len);
        header->payload_size = (uint32_t)payload.len;
        header->payload = (uint64_t)(uintptr_t)(region + PAYLOAD_AT(area));
        __atomic_store_n(&header->published_at_ns, now_ns(), __ATOMIC_SEQ_CST);
    }
    PyObject *address = PyLong_FromVoidPtr(region);
    pthread_mutex_unlock(&publish_lock);
    PyBuffer_Release(&payload);
    return address;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"set_span", set_span, METH_VARARGS,
     "set_span(trace_id: bytes, span_id: bytes, trace_flags: int, attrs: bytes): this thread runs in that span"},
    {"clear_span", clear_span, METH_NOARGS, "clear_span(): this thread runs in no span"},
    {"thread_context_address", thread_context_address, METH_NOARGS,
     "thread_context_address() -> int: where this thread's otel_thread_ctx_v1 is"},
    {"publish", publish, METH_VARARGS,
     "publish(resource: bytes) -> int: publish (or update) the process context; the region's address"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    /* The first access resolves the TLS descriptor: a reader finds the variable from now on,
     * not only after this thread's first span. */
    otel_thread_ctx_v1 = NULL;
    pthread_atfork(NULL, NULL, forget_region_in_child);
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ATTRS_CAPACITY", ATTRS_CAPACITY) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
