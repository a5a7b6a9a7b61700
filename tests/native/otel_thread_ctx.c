/* A writer of OpenTelemetry thread contexts (OTEP 4947), as an SDK's native library would be:
 * the TLS variable otel_thread_ctx_v1 (exported in .dynsym) points at the running thread's record.
 *
 * Built by the tests as a shared library with TLSDESC (-mtls-dialect=gnu2, the OTEP's recommended
 * model), and linked into a program as it is (the variable then in the executable: local-exec).
 * otel_ctx_attach() fills the thread's record and points the variable at it;
 * otel_ctx_detach() clears the pointer. otel_ctx_tp_offset() says where the variable is from the
 * thread pointer, for the tests to check what a reader computes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct __attribute__((packed)) otel_thread_ctx_record {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t valid;
    uint8_t trace_flags;
    uint16_t attrs_data_size;
    uint8_t attrs_data[612];
};

__attribute__((visibility("default"))) __thread struct otel_thread_ctx_record *otel_thread_ctx_v1;
static __thread struct otel_thread_ctx_record record __attribute__((aligned(8)));

void otel_ctx_attach(const uint8_t *trace_id, const uint8_t *span_id, uint8_t trace_flags,
                     const uint8_t *attrs, uint16_t attrs_size)
{
    otel_thread_ctx_v1 = NULL;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    memcpy(record.trace_id, trace_id, 16);
    memcpy(record.span_id, span_id, 8);
    record.trace_flags = trace_flags;
    if (attrs_size > sizeof(record.attrs_data))
        attrs_size = sizeof(record.attrs_data);
    memcpy(record.attrs_data, attrs, attrs_size);
    record.attrs_data_size = attrs_size;
    record.valid = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    otel_thread_ctx_v1 = &record;
}

/* For the tests' hostile publisher: the variable set to any value. */
void otel_ctx_set_raw(void *pointer)
{
    otel_thread_ctx_v1 = pointer;
}

/* For the tests' hostile publisher: a record that says its attributes take `size` bytes. */
void otel_ctx_set_attrs_size(uint16_t size)
{
    record.attrs_data_size = size;
}

void otel_ctx_detach(void)
{
    otel_thread_ctx_v1 = NULL;
}

long otel_ctx_tp_offset(void)
{
    return (long)((char *)&otel_thread_ctx_v1 - (char *)__builtin_thread_pointer());
}
