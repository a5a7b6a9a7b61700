/* V8's JavaScript frames: for a Node.js process user space found V8 in (v8_processes), a frame
 * whose pc lies in V8's code (a mapping of kind MAPPING_V8_CODE) is recorded as the function it
 * runs (RUNTIME_FRAME_TAG in profile.h) rather than as a pc in code a JIT wrote and nothing names.
 * Pasted into profile.bpf.c before unwind.bpf.c, which calls v8_frame for such frames and then
 * steps by frame pointer, as V8's code always keeps one. */

BPF_HASH(v8_processes, u32, struct v8_process, UNWIND_MAX_PROCESSES);

#define V8_FRAME_SLOTS 8  /* the 64 bytes below a frame pointer, where V8 keeps a frame's slots */

static __always_inline u64 v8_slot(u64 *slots, u8 index)
{
    return slots[index & (V8_FRAME_SLOTS - 1)];
}

/* A compiled frame's value for a stack that does not hold its pc after it. */
static __always_inline u64 v8_without_pc(u64 value)
{
    if (value >> RUNTIME_FRAME_KIND_SHIFT == (RUNTIME_FRAME_TAG | V8_FRAME_COMPILED << RUNTIME_FRAME_KIND_SHIFT) >> RUNTIME_FRAME_KIND_SHIFT)
        value |= V8_FRAME_COMPILED_NO_PC << RUNTIME_FRAME_KIND_SHIFT;
    return value;
}

/* Whether `object` (a tagged pointer) is a heap object whose map says it is a JSFunction. */
static __always_inline int v8_is_function(struct v8_process *v8, u64 object)
{
    if ((object & 3) != 1 || object >= (1ULL << 47))
        return 0;
    u64 map;
    if (read_user(&map, sizeof(map), (void *)(object - 1)) || (map & 3) != 1)
        return 0;
    u16 type;
    if (read_user(&type, sizeof(type), (void *)(map - 1 + v8->map_instance_type)))
        return 0;
    return type >= v8->first_function_type && type <= v8->last_function_type;
}

/* The value to record for the frame whose frame pointer is `bp` (running in the builtins or not),
 * or 0 when
 * it is not a JavaScript frame (an entry, exit or stub frame: the pc stays, named by its builtin). */
static __always_inline u64 v8_frame(u32 tgid, u64 bp, int in_builtins)
{
    struct v8_process *v8 = v8_processes.lookup(&tgid);
    if (!v8)
        return 0;
    u64 slots[V8_FRAME_SLOTS];
    if (read_user(slots, sizeof(slots), (void *)(bp - sizeof(slots))))
        return 0;
    u64 function = v8_slot(slots, v8->function_slot);
    if (!(v8_slot(slots, v8->context_slot) & 1) || !v8_is_function(v8, function)) {
        count(COUNTER_V8_NOT_JS);
        return 0;
    }
    u64 shared;
    if (read_user(&shared, sizeof(shared), (void *)(function - 1 + v8->function_shared)) ||
        (shared & 3) != 1 || shared > V8_FRAME_POINTER_MASK)
        return 0;
    u64 value = RUNTIME_FRAME_TAG | shared;
    u64 offset = v8_slot(slots, v8->bytecode_offset_slot);
    /* An interpreted frame runs in the builtins and holds its bytecode offset there, a Smi (the
     * value in the upper half). Code that replaced it on the stack (on-stack replacement) keeps
     * that slot, so the pc must say it too. */
    if (in_builtins && (offset & 0xffffffffULL) == 0 && offset) {
        offset >>= 32;
        if (offset > V8_FRAME_OFFSET_MAX)
            offset = V8_FRAME_OFFSET_MAX;
        value |= V8_FRAME_INTERPRETED << RUNTIME_FRAME_KIND_SHIFT | offset << V8_FRAME_OFFSET_SHIFT;
    } else {
        value |= V8_FRAME_COMPILED << RUNTIME_FRAME_KIND_SHIFT;
    }
    count(COUNTER_V8_FRAMES);
    return value;
}
