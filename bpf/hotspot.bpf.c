/* HotSpot's Java frames: for a JVM user space found (hotspot_processes), a frame whose pc lies
 * in the code cache (a mapping of kind MAPPING_HOTSPOT_CODE) is found in the code cache's segment
 * map, and stepped as the JVM lays it out: an interpreted frame through its frame pointer, a
 * compiled one by the frame size its CodeBlob gives (the JIT keeps no frame pointer), a stub by
 * either. Java frames are recorded as the Method they run (HOTSPOT_FRAME_* in profile.h).
 * Pasted into unwind.bpf.c after its frame-pointer steps, before unwind_one, which calls
 * hotspot_frame. */

BPF_HASH(hotspot_processes, u32, struct hotspot_process, UNWIND_MAX_PROCESSES);

#define HOTSPOT_SEGMAP_STEPS 12  /* back-steps to a block's start: the longest chain seen is 9 */
/* The interpreter's frame (x86-64, JDK 9+; not exported by the JVM, the same in every release):
 * rbp + 8 the return address, rbp the caller's rbp, rbp - 8 the caller's sp, rbp - 24 the
 * Method, rbp - 64 the bytecode pointer. */
#define HOTSPOT_INTERPRETER_SENDER_SP (-8)
#define HOTSPOT_INTERPRETER_METHOD (-24)
#define HOTSPOT_INTERPRETER_BCP (-64)
#define HOTSPOT_MAX_FRAME (1 << 16)  /* bytes: a frame pointer farther up is not this frame's */

enum hotspot_blob_kind { HOTSPOT_STUB, HOTSPOT_INTERPRETER, HOTSPOT_NMETHOD, HOTSPOT_NATIVE_NMETHOD, HOTSPOT_VTABLE };

/* The CodeBlob holding `pc`, or 0. */
static __always_inline u64 hotspot_blob(struct hotspot_process *jvm, u64 pc)
{
    struct hotspot_heap *heap = NULL;
    for (int i = 0; i < HOTSPOT_HEAPS; i++) {
        if (jvm->heaps[i].low <= pc && pc < jvm->heaps[i].high) {
            heap = &jvm->heaps[i];
            break;
        }
    }
    if (!heap)
        return 0;
    u64 shift = jvm->segment_shift & 31;
    u64 segment = (pc - heap->low) >> shift;
    for (int i = 0; i < HOTSPOT_SEGMAP_STEPS; i++) {
        u8 back;
        if (read_user(&back, sizeof(back), (void *)(heap->segmap + segment)) || back == 0xff)
            return 0;
        if (back == 0)
            return heap->low + (segment << shift) + jvm->heap_block_size;
        if (back > segment)
            return 0;
        segment -= back;
    }
    return 0;
}

static __always_inline enum hotspot_blob_kind hotspot_kind(struct hotspot_process *jvm, u64 blob)
{
    u64 name;
    u32 start = 0;
    if (read_user(&name, sizeof(name), (void *)(blob + jvm->blob_name)) || read_user(&start, sizeof(start), (void *)name))
        return HOTSPOT_STUB;
    switch (start) {
    case 0x74656d6e:  /* "nmet"hod */
        return HOTSPOT_NMETHOD;
    case 0x6974616e:  /* "nati"ve nmethod */
        return HOTSPOT_NATIVE_NMETHOD;
    case 0x65746e49:  /* "Inte"rpreter */
        return HOTSPOT_INTERPRETER;
    case 0x62617476:  /* "vtab"le chunks */
        return HOTSPOT_VTABLE;
    }
    return HOTSPOT_STUB;
}

/* Step the frame at state->pc (in the code cache) to its caller; `*value` gets what to record in
 * its place (0: its pc stays) and `*next` the slot that goes after it. */
static __always_inline enum step_result hotspot_frame(struct unwind_state *state, u32 depth, u64 *value, u64 *next)
{
    struct hotspot_process *jvm = hotspot_processes.lookup(&state->key.tgid);
    if (!jvm)  /* (its entry could not be written): as before there was a walker for it */
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    u64 pc = state->pc - (depth ? 1 : 0);
    u64 blob = hotspot_blob(jvm, pc);
    if (!blob) {
        count(COUNTER_HOTSPOT_NO_BLOB);
        return STEP_DONE;
    }
    enum hotspot_blob_kind kind = hotspot_kind(jvm, blob);
    u64 frame[2];
    if (kind == HOTSPOT_INTERPRETER) {
        u64 bp = state->bp;
        u64 slots[10];  /* rbp - 64 .. rbp + 8 */
        if (!state->bp_known || bp < state->sp || bp - state->sp > HOTSPOT_MAX_FRAME ||
            read_user(slots, sizeof(slots), (void *)(bp + HOTSPOT_INTERPRETER_BCP))) {
            count(COUNTER_HOTSPOT_BAD_FRAME);
            return STEP_DONE;
        }
        u64 method = slots[(HOTSPOT_INTERPRETER_METHOD - HOTSPOT_INTERPRETER_BCP) / 8];
        if (method && method < (1ULL << 47)) {
            *value = V8_FRAME_TAG | HOTSPOT_FRAME_INTERPRETED << V8_FRAME_KIND_SHIFT | method;
            *next = slots[0];  /* the bcp: user space finds the bytecode index from it */
            count(COUNTER_HOTSPOT_FRAMES);
        }
        state->sp = slots[(HOTSPOT_INTERPRETER_SENDER_SP - HOTSPOT_INTERPRETER_BCP) / 8];
        state->bp = slots[8];  /* the caller's rbp, where rbp points */
        state->pc = slots[9];
        state->bp_known = 1;
        return state->pc ? STEP_CONTINUE : STEP_COMPLETE;
    }
    if (kind == HOTSPOT_VTABLE) {  /* no frame: the return address is on top of the stack */
        if (read_user(&state->pc, sizeof(state->pc), (void *)state->sp))
            return STEP_DONE;
        state->sp += 8;
        count(COUNTER_HOTSPOT_STUB_FRAMES);
        return STEP_CONTINUE;
    }
    s32 frame_words = 0, complete = 0;
    u64 code_begin = 0;
    if (read_user(&frame_words, sizeof(frame_words), (void *)(blob + jvm->blob_frame_size)) ||
        read_user(&complete, jvm->frame_complete_is_short ? 2 : 4, (void *)(blob + jvm->blob_frame_complete)) ||
        read_user(&code_begin, jvm->code_begin_is_offset ? 4 : 8, (void *)(blob + jvm->blob_code_begin))) {
        count(COUNTER_HOTSPOT_BAD_FRAME);
        return STEP_DONE;
    }
    if (jvm->frame_complete_is_short)
        complete = (s16)complete;
    if (jvm->code_begin_is_offset)
        code_begin = blob + (u64)(s64)(s32)code_begin;
    if (kind == HOTSPOT_NMETHOD || kind == HOTSPOT_NATIVE_NMETHOD) {
        u64 method = 0;
        if (!read_user(&method, sizeof(method), (void *)(blob + jvm->nmethod_method)) && method && method < (1ULL << 47)) {
            *value = V8_FRAME_TAG | HOTSPOT_FRAME_COMPILED << V8_FRAME_KIND_SHIFT | method;
            *next = state->pc;
            count(COUNTER_HOTSPOT_FRAMES);
        }
    } else {
        count(COUNTER_HOTSPOT_STUB_FRAMES);
    }
    u64 size = frame_words > 0 ? (u64)frame_words * 8 : 0;
    if (size > HOTSPOT_MAX_FRAME) {
        count(COUNTER_HOTSPOT_BAD_FRAME);
        return STEP_DONE;
    }
    /* The leaf before its frame is complete (the prologue): the return address is on top of the
     * stack, with the caller's rbp pushed above it from 4 bytes before completion on. */
    if (depth == 0 && complete > 0 && pc < code_begin + complete) {
        int pushed = pc >= code_begin + complete - 4;
        if (read_user(frame, sizeof(frame), (void *)state->sp))
            return STEP_DONE;
        state->pc = pushed ? frame[1] : frame[0];
        state->bp = pushed ? frame[0] : state->bp;
        state->sp += pushed ? 16 : 8;
        return STEP_CONTINUE;
    }
    if (size == 0)  /* no size: the call stub and the adapters keep rbp */
        return frame_pointer_step(state);
    /* (With -XX:+PreserveFramePointer rbp is this frame's too, and the size leads to the same
     * caller; without it, compiled code uses rbp as it likes, so it is never followed here.) */
    /* The frame size covers the return address and the saved rbp, at its top. */
    state->sp += size;
    if (read_user(frame, sizeof(frame), (void *)(state->sp - 16)))
        return STEP_DONE;
    state->bp = frame[0];
    state->pc = frame[1];
    state->bp_known = 1;
    return state->pc ? STEP_CONTINUE : STEP_COMPLETE;
}
