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

/* HOTSPOT_FRAMELESS: code that runs on its caller's frame, the return address on top of the stack
 * (vtable and itable stubs, inline cache stubs). */
enum hotspot_blob_kind { HOTSPOT_STUB, HOTSPOT_INTERPRETER, HOTSPOT_NMETHOD, HOTSPOT_NATIVE_NMETHOD, HOTSPOT_FRAMELESS };

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
    case 0x696c6e49:  /* "Inli"neCacheBuffer (up to JDK 21) */
        return HOTSPOT_FRAMELESS;
    }
    return HOTSPOT_STUB;
}

struct hotspot_blob_frame {
    s32 frame_words;  /* the frame's size, return address and saved rbp included */
    s32 complete;     /* where, from code_begin, its frame is built (-1: not said) */
    u64 code_begin;
};

/* What `blob` says of its frame; nonzero when it could not be read. */
static __always_inline int hotspot_blob_frame(struct hotspot_process *jvm, u64 blob, struct hotspot_blob_frame *shape)
{
    shape->frame_words = shape->complete = 0;
    shape->code_begin = 0;
    if (read_user(&shape->frame_words, sizeof(shape->frame_words), (void *)(blob + jvm->blob_frame_size)) ||
        read_user(&shape->complete, jvm->frame_complete_is_short ? 2 : 4, (void *)(blob + jvm->blob_frame_complete)) ||
        read_user(&shape->code_begin, jvm->code_begin_is_offset ? 4 : 8, (void *)(blob + jvm->blob_code_begin)))
        return -1;
    if (jvm->frame_complete_is_short)
        shape->complete = (s16)shape->complete;
    if (jvm->code_begin_is_offset)
        shape->code_begin = blob + (u64)(s64)(s32)shape->code_begin;
    return 0;
}

/* Whether the instructions at `code` (16 bytes) return to the caller with only the return
 * address left on the stack: `ret`, or before it the return's safepoint poll, as C1 and C2 emit
 * it (JDK 17+: cmp rsp, [r15 + poll word]; ja stub. JDK 11: mov r10, [r15 + polling page];
 * test [r10], eax). */
static __always_inline int hotspot_returns(const u8 *code)
{
    if (code[0] == 0xc3)
        return 1;
    if (code[0] == 0x0f && code[1] == 0x87)  /* ja rel32 */
        return code[6] == 0xc3;
    if (code[0] == 0x49 && code[1] == 0x3b && code[2] == 0x67)  /* cmp rsp, [r15 + disp8] */
        return code[4] == 0x0f && code[5] == 0x87 && code[10] == 0xc3;
    if (code[0] == 0x49 && code[1] == 0x3b && code[2] == 0xa7)  /* cmp rsp, [r15 + disp32] */
        return code[7] == 0x0f && code[8] == 0x87 && code[13] == 0xc3;
    if (code[0] == 0x41 && code[1] == 0x85 && code[2] == 0x02)  /* test [r10], eax */
        return code[3] == 0xc3;
    if (code[0] == 0x4d && code[1] == 0x8b && code[2] == 0x97)  /* mov r10, [r15 + disp32] */
        return code[7] == 0x41 && code[8] == 0x85 && code[9] == 0x02 && code[10] == 0xc3;
    return 0;
}

#define HOTSPOT_PROLOGUE_WINDOW 64  /* bytes before frame completion in which the frame is built */

struct hotspot_code {  /* the instructions a leaf's edge is read from: too big for the BPF stack */
    u8 at_pc[16];
    u8 prologue[HOTSPOT_PROLOGUE_WINDOW + 16];
};
BPF_PERCPU_ARRAY(hotspot_code, struct hotspot_code, 1);

/* Where, from sp, a leaf's return address is while its frame is not built yet or no longer is
 * (-1: its frame is whole, its size leads to it); *pushed says whether the caller's rbp is at sp,
 * pushed below the return address (else rbp still holds it).
 *
 * The epilogue is told by the instructions at pc, which the sample interrupted before they ran:
 * `pop rbp` then the return (rbp and the return address on top) or the return alone. The
 * prologue runs up to the blob's frame completion: anything (inline cache check, stack bang),
 * then the frame is built, then maybe the nmethod entry barrier (JDK 20+). It is built as
 * `push rbp; [mov rbp, rsp;] sub rsp, n` or, without a stack bang, `sub rsp, n;
 * mov [rsp + d], rbp` (the return address then at d + 8); the last such sequence before
 * completion is where pc is compared against. */
static __always_inline s64 hotspot_leaf_edge(u64 pc, u64 code_begin, s32 complete, u64 size, int *pushed)
{
    *pushed = 0;
    u32 zero = 0;
    struct hotspot_code *scratch = hotspot_code.lookup(&zero);
    if (!scratch)
        return -1;
    u8 *code = scratch->at_pc;
    if (read_user(code, sizeof(scratch->at_pc), (void *)pc))
        return -1;
    if (hotspot_returns(code))
        return 0;
    if (code[0] == 0x5d && hotspot_returns(code + 1)) {  /* pop rbp */
        *pushed = 1;
        return 8;
    }
    if (complete <= 0 || pc >= code_begin + complete || pc < code_begin)
        return -1;
    u8 *window = scratch->prologue;
    u64 start = code_begin + complete > code_begin + HOTSPOT_PROLOGUE_WINDOW ? code_begin + complete - HOTSPOT_PROLOGUE_WINDOW : code_begin;
    if (read_user(window, sizeof(scratch->prologue), (void *)start))
        return -1;
    if (pc < start)  /* (before the window: before the frame is built) */
        return 0;
    u64 at = pc - start;
    /* The last building before completion: one 4-byte load a step, nothing carried from one step
     * to the next (the verifier follows every branch of every step). */
    s32 found = -1, no_bang = 0;
#pragma clang loop unroll(disable)
    for (int i = HOTSPOT_PROLOGUE_WINDOW - 1; i >= 0; i--) {
        u32 word, saving;
        __builtin_memcpy(&word, window + (i & (HOTSPOT_PROLOGUE_WINDOW - 1)), 4);
        if (word == 0xec834855 || word == 0xec814855 || word == 0xec8b4855 || word == 0xe5894855) {
            found = i;  /* push rbp; sub rsp, n  or  push rbp; mov rbp, rsp */
            break;
        }
        __builtin_memcpy(&saving, window + (i & (HOTSPOT_PROLOGUE_WINDOW - 1)) + 7, 4);
        if ((word & 0xffffff) == 0xec8148 && (saving == 0x246c8948 || saving == 0x24ac8948)) {
            found = i;  /* sub rsp, imm32; mov [rsp + d], rbp */
            no_bang = 1;
            break;
        }
    }
    if (found < 0)  /* (a shape not known: as before, rbp taken for pushed 4 bytes before completion) */
        return pc >= code_begin + complete - 4 ? (*pushed = 1, 8) : 0;
    u32 i = found & (HOTSPOT_PROLOGUE_WINDOW - 1);
    if (at <= i)
        return 0;
    u8 *c = window + i;
    if (no_bang) {
        s64 saved = c[9] == 0x6c ? (s64)(s8)c[11] : (s64)(c[11] | c[12] << 8 | c[13] << 16 | (u32)c[14] << 24);
        if (at == i + 7 && saved >= 0 && saved + 16 <= (s64)size)
            return saved + 8;  /* rbp not saved yet, the frame made */
        return -1;
    }
    u64 built = i + 1;
    if (c[2] == 0x8b || c[2] == 0x89)  /* (mov rbp, rsp first) */
        built += 3;
    u8 *sub = window + (built & (HOTSPOT_PROLOGUE_WINDOW - 1));
    if (sub[0] == 0x48 && (sub[1] == 0x83 || sub[1] == 0x81) && sub[2] == 0xec)
        built += sub[1] == 0x83 ? 4 : 7;
    if (at >= built)
        return -1;
    *pushed = 1;
    return 8;
}

#define HOTSPOT_LEAF_PUSHED (1U << 31)

/* As a walk starts (unwind_state.hotspot_leaf): 0 when the sample's pc is not in compiled code of
 * the code cache (Java's, a stub's) or its frame is whole; else where its return address is,
 * from sp, plus 1, with HOTSPOT_LEAF_PUSHED when rbp was pushed below it. Read once a sample,
 * outside the walk's loop: the prologue's scan is too long to verify in each of its steps. */
static __always_inline u32 hotspot_leaf(struct unwind_state *state)
{
    struct hotspot_process *jvm = hotspot_processes.lookup(&state->key.tgid);
    if (!jvm || state->pc < jvm->code_low || state->pc >= jvm->code_high)
        return 0;
    u64 blob = hotspot_blob(jvm, state->pc);
    if (!blob)
        return 0;
    enum hotspot_blob_kind kind = hotspot_kind(jvm, blob);
    struct hotspot_blob_frame shape;
    if (kind == HOTSPOT_INTERPRETER || kind == HOTSPOT_FRAMELESS || hotspot_blob_frame(jvm, blob, &shape) ||
        shape.frame_words <= 0 || shape.frame_words > HOTSPOT_MAX_FRAME / 8)
        return 0;
    int pushed;
    s64 return_slot = hotspot_leaf_edge(state->pc, shape.code_begin, shape.complete, (u64)shape.frame_words * 8, &pushed);
    if (return_slot < 0 || return_slot >= HOTSPOT_MAX_FRAME)
        return 0;
    return (u32)(return_slot + 1) | (pushed ? HOTSPOT_LEAF_PUSHED : 0);
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
            *value = RUNTIME_FRAME_TAG | HOTSPOT_FRAME_INTERPRETED << RUNTIME_FRAME_KIND_SHIFT | method;
            *next = slots[0];  /* the bcp: user space finds the bytecode index from it */
            count(COUNTER_HOTSPOT_FRAMES);
        }
        state->sp = slots[(HOTSPOT_INTERPRETER_SENDER_SP - HOTSPOT_INTERPRETER_BCP) / 8];
        state->bp = slots[8];  /* the caller's rbp, where rbp points */
        state->pc = slots[9];
        state->bp_known = 1;
        return state->pc ? STEP_CONTINUE : STEP_COMPLETE;
    }
    if (kind == HOTSPOT_FRAMELESS) {  /* no frame: the return address is on top of the stack */
        if (read_user(&state->pc, sizeof(state->pc), (void *)state->sp))
            return STEP_DONE;
        state->sp += 8;
        count(COUNTER_HOTSPOT_STUB_FRAMES);
        return STEP_CONTINUE;
    }
    struct hotspot_blob_frame shape;
    if (hotspot_blob_frame(jvm, blob, &shape)) {
        count(COUNTER_HOTSPOT_BAD_FRAME);
        return STEP_DONE;
    }
    s32 frame_words = shape.frame_words;
    if (kind == HOTSPOT_NMETHOD || kind == HOTSPOT_NATIVE_NMETHOD) {
        u64 method = 0;
        if (!read_user(&method, sizeof(method), (void *)(blob + jvm->nmethod_method)) && method && method < (1ULL << 47)) {
            *value = RUNTIME_FRAME_TAG | HOTSPOT_FRAME_COMPILED << RUNTIME_FRAME_KIND_SHIFT | method;
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
    /* A leaf whose frame is not built yet, or no longer (hotspot_leaf, as the walk started). */
    if (depth == 0 && state->hotspot_leaf) {
        u64 return_slot = (state->hotspot_leaf & ~HOTSPOT_LEAF_PUSHED) - 1;
        if (read_user(&state->pc, sizeof(state->pc), (void *)(state->sp + return_slot)))
            return STEP_DONE;
        if (state->hotspot_leaf & HOTSPOT_LEAF_PUSHED) {  /* the caller's rbp, just below the return address */
            if (read_user(&state->bp, sizeof(state->bp), (void *)state->sp))
                return STEP_DONE;
            state->bp_known = 1;
        }
        state->sp += return_slot + 8;
        count(COUNTER_HOTSPOT_LEAF_EDGES);
        return state->pc ? STEP_CONTINUE : STEP_COMPLETE;
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
