/* OpenTelemetry thread contexts (OTEP 4947): the span a sampled thread runs in.  Pasted into
 * profile.bpf.c after python.bpf.c (it uses current_fsbase()).
 *
 * An SDK in the process keeps, in each thread, the TLS variable otel_thread_ctx_v1: a pointer to
 * the record of the span the thread runs in (trace id, span id, a valid byte, flags, then
 * attributes), or NULL.  Where the variable is comes from user space (thread_ctx_locations, for the
 * processes that publish a thread context).  The record is read while the thread is stopped (an
 * interrupt, or its switch off the CPU), as the OTEP asks of readers: the thread cannot be halfway
 * through writing it. */

#ifndef THREAD_CTX_PROCESSES
#define THREAD_CTX_PROCESSES 4096
#endif
#ifndef THREAD_CTX_SPANS
#define THREAD_CTX_SPANS 4096
#endif
#define THREAD_CTX_HEAD_SIZE 28  /* the record's fixed part: ids, valid, flags, attrs-data-size */
#define TLS_DTV_ENTRY_SIZE 16  /* glibc's dtv_t on 64-bit: {void *val; void *to_free} */
#define TLS_TCB_DTV_OFFSET 8   /* x86-64 tcbhead_t: {void *tcb; dtv_t *dtv; ...} */

BPF_HASH(thread_ctx_locations, u32, struct thread_ctx_location, THREAD_CTX_PROCESSES);
/* The attributes of recent spans (least recently sampled ones give way): what a report names. */
BPF_TABLE("lru_hash", struct thread_ctx_span, struct thread_ctx_attrs, thread_ctx_attributes, THREAD_CTX_SPANS);
BPF_PERCPU_ARRAY(thread_ctx_scratch, struct thread_ctx_attrs, 1);  /* too big for the BPF stack */

struct otel_thread_ctx_head {
    u8 trace_id[16];
    u8 span_id[8];
    u8 valid;
    u8 trace_flags;
    u16 attrs_data_size;
};

/* The record's attributes under its span, as they are now (a later sample's replace them). A span
 * already known has its entry written in place: the LRU map's update (an allocation and a copy of
 * the whole value) is paid once per span, not per sample. */
static __always_inline void keep_span_attributes(struct sample_key *key, u64 record, u32 size)
{
    struct thread_ctx_span span;
    span.tgid = key->tgid;
    __builtin_memcpy(span.trace_id, key->trace_id, sizeof(span.trace_id));
    __builtin_memcpy(span.span_id, key->span_id, sizeof(span.span_id));
    struct thread_ctx_attrs *attrs = thread_ctx_attributes.lookup(&span);
    int known = attrs != NULL;
    if (!known) {
        u32 zero = 0;
        attrs = thread_ctx_scratch.lookup(&zero);
        if (!attrs)
            return;
    }
    if (size > THREAD_CTX_ATTRS_MAX) {
        count(COUNTER_THREAD_CTX_ATTRS_CUT);
        size = THREAD_CTX_ATTRS_MAX;
    }
    OPAQUE(size);
    size &= 2 * THREAD_CTX_ATTRS_MAX - 1;  /* for the verifier: it is at most THREAD_CTX_ATTRS_MAX */
    if (size > THREAD_CTX_ATTRS_MAX || size == 0)
        return;
    if (read_user(attrs->data, size, (void *)(record + THREAD_CTX_HEAD_SIZE))) {
        count(COUNTER_THREAD_CTX_READ_ERRORS);
        if (known)
            attrs->size = 0;  /* (the failed read zeroed what it held) */
        return;
    }
    attrs->tgid = key->tgid;
    attrs->size = size;
    if (!known)
        thread_ctx_attributes.update(&span, attrs);
}

/* The sampled thread's span into key->trace_id and span_id (left zero when it has none). */
static __always_inline void read_thread_context(struct sample_key *key)
{
    struct thread_ctx_location *where = thread_ctx_locations.lookup(&key->tgid);
    if (!where)
        return;
    u64 tp = current_fsbase();
    if (!tp)
        return;
    u64 variable;
    if (where->is_static) {
        variable = tp + where->tp_offset;
    } else {
        u64 dtv, block;
        if (read_user(&dtv, sizeof(dtv), (void *)(tp + TLS_TCB_DTV_OFFSET)) || !dtv)
            return;
        if (where->module >= 65536 ||
            read_user(&block, sizeof(block), (void *)(dtv + where->module * TLS_DTV_ENTRY_SIZE)))
            return;
        if (!block || block == (u64)-1)  /* the thread never touched the module's TLS: no context */
            return;
        variable = block + where->offset;
    }
    u64 record;
    if (read_user(&record, sizeof(record), (void *)variable) || !record)
        return;
    struct otel_thread_ctx_head head;
    if (read_user(&head, sizeof(head), (void *)record)) {
        count(COUNTER_THREAD_CTX_READ_ERRORS);
        return;
    }
    if (head.valid != 1)
        return;
    __builtin_memcpy(key->trace_id, head.trace_id, sizeof(key->trace_id));
    __builtin_memcpy(key->span_id, head.span_id, sizeof(key->span_id));
    count(COUNTER_THREAD_CTX_SAMPLES);
    if (head.attrs_data_size)
        keep_span_attributes(key, record, head.attrs_data_size);
}
