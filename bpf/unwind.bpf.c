/* The native unwinder: walks a user stack with the unwind rows user space made from each file's
 * .eh_frame, one frame-pointer step where a file has none.  Included by profile.bpf.c, after its
 * maps and helpers (count, add_sample_N, stack_by_value).  BCC rewrites map calls (x.lookup())
 * only in its main file, so the loader pastes this file in place of its #include (see
 * receivers/profiling/kernel/program.py) rather than letting clang include it.
 *
 * A walk spans several programs: on_cpu_sample (or off_cpu.bpf.c's leave_cpu and off_cpu_waking) starts it (the
 * registers, the sample's key) in a
 * per-CPU unwind_state and tail-calls unwind_step, which steps UNWIND_FRAMES_PER_CALL frames and
 * tail-calls itself until the stack ends or UNWIND_MAX_FRAMES is reached, then stores the stack
 * and counts the sample (finish_walk).  The kernel allows 33 tail calls a sample, so
 * UNWIND_MAX_FRAMES <= 30 * UNWIND_FRAMES_PER_CALL (kernel/settings.py picks the frames a call).
 *
 * A program can only tail-call programs of its own type.  Off-CPU stacks are taken in a raw
 * tracepoint (off_cpu.bpf.c), so with OFF_CPU the walk's programs exist twice, compiled from the
 * same code: the perf_event ones in unwind_programs and raw tracepoint ones in off_cpu_programs.
 * Each body takes `walk_set` (enum walk_program_set), a constant in each copy, to know which array
 * it chains through and how the walk ends.  The copies share the per-CPU unwind_state: neither
 * runs while the other is under way on a CPU (the scheduler's tracepoints run with interrupts
 * off, sched_waking's walk too: see off_cpu_waking; the cpu-clock program in an interrupt).
 *
 * With MEMORY_PROFILING, a third copy, as kprobe-type programs, walks the stacks of sampled
 * allocations (memory.bpf.c's uprobes, through memory_programs). Those run in the allocating
 * thread with interrupts and preemption on: the cpu-clock program can interrupt one mid-walk on
 * its CPU, and another thread's uprobe can run there while it is preempted. So a memory walk
 * keeps its state in memory_walks, under its thread's id, not in the per-CPU unwind_state
 * (walk_state()).
 *
 * Settings (cflags): UNWIND_ROW_BUDGET rows, UNWIND_MAX_FILES files, UNWIND_MAX_PROCESSES
 * processes, UNWIND_MAX_FRAMES frames a stack, UNWIND_FRAMES_PER_CALL frames a program. */

#ifndef UNWIND_ROW_BUDGET
#define UNWIND_ROW_BUDGET (1 << 20)
#endif
#ifndef UNWIND_MAX_FILES
#define UNWIND_MAX_FILES 4096
#endif
#ifndef UNWIND_MAX_PROCESSES
#define UNWIND_MAX_PROCESSES 4096
#endif
#ifndef UNWIND_FRAMES_PER_CALL
#define UNWIND_FRAMES_PER_CALL 16  /* (user space passes the fewest that reach UNWIND_MAX_FRAMES: kernel/settings.py) */
#endif
#define UNWIND_MAX_TAIL_CALLS 30
/* Enough halvings for any file: 2^25 rows is 400 MiB of them. */
#define UNWIND_ROW_SEARCH_STEPS 25
#define UNWIND_MAPPING_SEARCH_STEPS 10  /* log2(UNWIND_MAX_MAPPINGS) + 1 for up to 512 */
#define UNWIND_EVENT_INTERVAL_NS 100000000ULL  /* 100 ms: a re-read costs user space a fraction of a ms */
#define UNWIND_STEP_PROGRAM 0
#define PYTHON_WALK_PROGRAM 1  /* python.bpf.c */
#ifndef TASK_FSBASE_OFFSET
#define TASK_FSBASE_OFFSET 0  /* unknown (no BTF): user space registers no Python process */
#endif

BPF_ARRAY(unwind_rows, struct unwind_row, UNWIND_ROW_BUDGET);
BPF_ARRAY(unwind_files, struct unwind_file, UNWIND_MAX_FILES);
/* Frames that needed a file whose rows were still loading: user space loads the most wanted first. */
BPF_ARRAY(unwind_demand, u32, UNWIND_MAX_FILES);
/* Files whose rows a walk used since user space last looked: it gives the rows of files no one
 * runs back when the row budget is short (unwind/registry.py). */
BPF_ARRAY(unwind_used, u8, UNWIND_MAX_FILES);
BPF_F_TABLE("hash", u32, struct unwind_process, unwind_processes, UNWIND_MAX_PROCESSES, BPF_F_NO_PREALLOC);
BPF_PROG_ARRAY(unwind_programs, 2);
#ifdef OFF_CPU
BPF_PROG_ARRAY(off_cpu_programs, 2);  /* the same programs, as raw tracepoints (see above) */
#endif
#ifdef MEMORY_PROFILING
BPF_PROG_ARRAY(memory_programs, 2);  /* the same programs, as kprobes (uprobes: see above) */
#endif
/* Processes running CPython, and where its thread states and frames are (python.bpf.c). */
BPF_HASH(python_processes, u32, struct python_process, UNWIND_MAX_PROCESSES);
BPF_PERF_OUTPUT(unwind_events);
BPF_TABLE("lru_hash", u32, u64, unwind_event_times, 1024);
BPF_HASH(user_stacks_0, u64, struct user_stack, STACK_STORAGE_SIZE);
BPF_HASH(user_stacks_1, u64, struct user_stack, STACK_STORAGE_SIZE);

struct unwind_state {
    struct sample_key key;
    u64 pc;
    u64 sp;
    u64 bp;
    u32 slot;
    u32 tail_calls;
    u32 bp_known;  /* 0 once a row said rbp cannot be recovered: no frame-pointer step after that */
    u32 hotspot_leaf;  /* hotspot.bpf.c: where a Java leaf's return address is, as the walk starts */
    u64 leaf_return;  /* as sample_key.user_leaf_return: for a first step by frame pointer */
    u64 python_frame;  /* python_walk: the next Python frame to record */
    u32 python_len;    /* Python frames in `python`, which finish_walk appends to the stack */
    u32 wakee;         /* an off-CPU walk of a lock waiter's waker: the waiter's tid (set by off_cpu_waking), else 0 */
    u64 python[PYTHON_MAX_FRAMES];
    u64 value;       /* a memory walk's: the allocation's weight (bytes) */
    u64 memory_ptr;  /* and its pointer */
    u64 owed_weight;   /* and what the process's throttled allocations since its last counted one */
    u64 owed_objects;  /* stood for (memory.bpf.c's memory_throttled) */
    u32 rows_pending;  /* a frame was stepped by frame pointer while its file's rows were loading */
    u32 rows_reserved;
    struct user_stack stack;
};
BPF_PERCPU_ARRAY(unwind_state, struct unwind_state, 1);
#ifdef MEMORY_PROFILING
#ifndef MEMORY_WALKS
#define MEMORY_WALKS 1024  /* threads walking an allocation's stack at once */
#endif
/* tid -> its memory walk under way (see above), from the uprobe to the walk's end. */
BPF_HASH(memory_walks, u32, struct unwind_state, MEMORY_WALKS);
#endif

enum step_result { STEP_CONTINUE, STEP_DONE, STEP_COMPLETE };

/* Which copies of the walk's programs a program chains through (see the top of this file): its
 * `walk_set` argument, a constant in each copy. */
enum walk_program_set { WALK_ON_CPU = 0, WALK_OFF_CPU = 1, WALK_MEMORY = 2 };

/* The state of the walk under way: this CPU's, or a memory walk's, this thread's (see above). */
static __always_inline struct unwind_state *walk_state(int walk_set)
{
#ifdef MEMORY_PROFILING
    if (walk_set == WALK_MEMORY) {
        u32 tid = bpf_get_current_pid_tgid();
        return memory_walks.lookup(&tid);
    }
#endif
    u32 zero = 0;
    return unwind_state.lookup(&zero);
}

/* Tail-call program `index` of the walk (UNWIND_STEP_PROGRAM, PYTHON_WALK_PROGRAM) in
 * `walk_set`.  Returns only if the call failed. */
static __always_inline void walk_next(void *ctx, int walk_set, u32 index)
{
#ifdef MEMORY_PROFILING
    if (walk_set == WALK_MEMORY) {
        memory_programs.call(ctx, index);
        return;
    }
#endif
#ifdef OFF_CPU
    if (walk_set == WALK_OFF_CPU) {
        off_cpu_programs.call(ctx, index);
        return;
    }
#endif
    unwind_programs.call(ctx, index);
}

/* The registers of the user code the task left: the sample's own when it hit user mode, else the
 * ones the kernel saved on entry (syscall, fault; `interrupted` is NULL off-CPU, where the task is
 * always in the kernel).  Return 0, or -1 for a kernel thread. */
static __always_inline int user_registers(struct pt_regs *interrupted, u64 *pc, u64 *sp, u64 *bp)
{
    if (interrupted && (interrupted->cs & 3) == 3) {
        *pc = interrupted->ip;
        *sp = interrupted->sp;
        *bp = interrupted->bp;
        return 0;
    }
    struct task_struct *task = bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    if (!regs)
        return -1;
    if (bpf_probe_read_kernel(sp, sizeof(*sp), &regs->sp) || *sp == 0)
        return -1;  /* a kernel thread has no user stack */
    if (bpf_probe_read_kernel(pc, sizeof(*pc), &regs->ip) || bpf_probe_read_kernel(bp, sizeof(*bp), &regs->bp))
        return -1;
    return 0;
}

/* Hides a value from clang's reasoning, so that a bound the verifier needs (a mask, a comparison)
 * is not dropped because clang proved it redundant in a way the verifier cannot follow. */
#define OPAQUE(var) asm volatile("" : "+r"(var))

/* The searches below take a fixed number of steps and choose a half without branching: the
 * verifier follows every branch, and a branch per step of a search per frame is more paths than it
 * will walk.  Each step halves `count`; `base` moves up by the lower half when the entry there is
 * at or below the target.  (a - b) >> 63 is 1 exactly when a < b, for a and b below 2^63. */
static __always_inline u64 at_or_below(u64 value, u64 target)
{
    return ((target - value) >> 63) ^ 1;
}

/* The mapping holding pc: the last one starting at or below it, if it ends above. */
static __always_inline struct unwind_mapping *find_mapping(struct unwind_process *process, u64 pc)
{
    u32 count = process->count;
    if (count == 0 || count > UNWIND_MAX_MAPPINGS)
        return NULL;
    /* Indices are masked rather than compared: clang drops a comparison it can prove, and the
     * verifier then cannot (UNWIND_MAX_MAPPINGS is a power of two). */
    u32 base = 0;
    for (int i = 0; i < UNWIND_MAPPING_SEARCH_STEPS; i++) {
        u32 half = count / 2;
        u32 probe = base + half;
        OPAQUE(probe);
        probe &= UNWIND_MAX_MAPPINGS - 1;
        base += half * at_or_below(process->mappings[probe].start, pc);
        count -= half;
    }
    OPAQUE(base);
    struct unwind_mapping *mapping = &process->mappings[base & (UNWIND_MAX_MAPPINGS - 1)];
    return mapping->start <= pc && pc < mapping->end ? mapping : NULL;
}

/* The row in effect at file address `address`: the last of the file's rows starting at or below it. */
static __always_inline struct unwind_row *find_row(struct unwind_file *file, u32 address)
{
    u32 count = file->row_count, base = file->first_row;
    if (count == 0)
        return NULL;
    for (int i = 0; i < UNWIND_ROW_SEARCH_STEPS; i++) {
        u32 half = count / 2;
        u32 index = base + half;
        struct unwind_row *row = unwind_rows.lookup(&index);
        if (!row)
            return NULL;
        base += half * at_or_below(row->pc, address);
        count -= half;
    }
    struct unwind_row *row = unwind_rows.lookup(&base);
    return row && row->pc <= address ? row : NULL;
}

/* Ask user space, at most every 100 ms per process, to read the process's maps again. */
static __always_inline void request_maps(void *ctx, u32 tgid, u64 pc)
{
    u64 now = bpf_ktime_get_ns();
    u64 *last = unwind_event_times.lookup(&tgid);
    if (last && now - *last < UNWIND_EVENT_INTERVAL_NS)
        return;
    unwind_event_times.update(&tgid, &now);
    struct unwind_event event = {.tgid = tgid, .pc = pc};
    if (unwind_events.perf_submit(ctx, &event, sizeof(event)) == 0)
        count(COUNTER_UNWIND_MAP_REQUESTS);
}

/* The caller by frame pointer: [rbp] is the caller's rbp, [rbp + 8] the return address. */
static __always_inline enum step_result frame_pointer_step(struct unwind_state *state)
{
    if (!state->bp_known)
        return STEP_DONE;
    if (state->bp == 0)  /* the ABI's mark of the outermost frame (_start clears rbp) */
        return STEP_COMPLETE;
    u64 frame[2];
    if (read_user(frame, sizeof(frame), (void *)state->bp)) {
        count(COUNTER_UNWIND_READ_ERRORS);
        return STEP_DONE;
    }
    count(COUNTER_UNWIND_FP_FRAMES);
    /* The stack grows down: a caller's frame lies above. Anything else is not a frame chain. */
    if (frame[0] != 0 && frame[0] <= state->bp)
        state->bp_known = 0;
    state->sp = state->bp + 16;
    state->bp = frame[0];
    state->pc = frame[1];
    return state->pc ? STEP_CONTINUE : STEP_COMPLETE;
}

/* The leaf's caller by frame pointer, as the kernel's walk does it, and as user space mends that
 * walk: a leaf without a frame of its own (or before its prologue) leaves rbp to its caller, so
 * [rbp + 8] skips one frame; the return address on top of the stack is that frame. */
static __always_inline enum step_result first_frame_pointer_step(struct unwind_state *state)
{
    enum step_result result = frame_pointer_step(state);
    u32 depth = state->stack.len;
    if (result == STEP_CONTINUE && state->leaf_return && state->leaf_return != state->pc &&
        depth < UNWIND_MAX_FRAMES) {
        state->stack.ips[depth] = state->leaf_return;
        state->stack.len = depth + 1;
    }
    return result;
}

#include "hotspot.bpf.c"

/* Record a runtime's frame in place of the pc just recorded at `depth`: `value` followed by
 * `next` when `with_next` and the stack has room for both, else `alone` (the value whose kind says
 * no slot follows it). */
static __always_inline void record_runtime_frame(struct unwind_state *state, u32 depth, u64 value, int with_next, u64 next,
                                                 u64 alone)
{
    u64 slot = (u64)depth + 1;  /* (64 bits: a bound checked on a 32-bit copy does not carry over) */
    int room = with_next && slot + state->python_len < UNWIND_MAX_FRAMES;
    OPAQUE(depth);  /* else clang merges the bounds into one the verifier cannot follow */
    if (depth >= UNWIND_MAX_FRAMES)
        return;
    state->stack.ips[depth] = room ? value : alone;
    OPAQUE(slot);
    if (!room || slot >= UNWIND_MAX_FRAMES)
        return;
    state->stack.ips[slot] = next < USER_ADDRESS_END ? next : 0;
    state->stack.len = slot + 1;
}

/* A frame in the JVM's code cache (hotspot.bpf.c): a Java frame recorded as its Method, with its
 * bytecode pointer or pc after it. */
static __always_inline enum step_result hotspot_step(struct unwind_state *state, u32 depth)
{
    u64 value = 0, next = 0;
    enum step_result result = hotspot_frame(state, depth, &value, &next);
    if (value)
        record_runtime_frame(state, depth, value, 1, next,
                             (value & ~(7ULL << RUNTIME_FRAME_KIND_SHIFT)) | HOTSPOT_FRAME_NO_NEXT << RUNTIME_FRAME_KIND_SHIFT);
    return result;
}

/* Record a JavaScript frame's value at `depth`, and a compiled one's pc after it (which user space
 * needs for its line and the functions inlined there), or the value that says no pc follows. */
static __always_inline int v8_compiled(u64 value)
{
    return value >> RUNTIME_FRAME_KIND_SHIFT == (RUNTIME_FRAME_TAG | V8_FRAME_COMPILED << RUNTIME_FRAME_KIND_SHIFT) >> RUNTIME_FRAME_KIND_SHIFT;
}

static __always_inline void record_v8_frame(struct unwind_state *state, u32 depth, u64 value, u64 pc)
{
    int compiled = v8_compiled(value);
    record_runtime_frame(state, depth, value, compiled, pc, compiled ? v8_without_pc(value) : value);
}

#define V8_RETURN_SCAN 4  /* words from the top of the stack looked at for a builtin's return address */

/* A leaf in a builtin that compiled JavaScript called, when the word on top of the stack is not
 * its return address (Modulus_Baseline keeps a double there for x87's fprem): the return
 * address, the first word above that is an address in V8's JIT code after a call, or 0. Only
 * words below the frame pointer: from there up the stack is the JavaScript frame's own. */
static __always_inline u64 v8_builtin_return(struct unwind_state *state, struct unwind_process *process)
{
    u64 words[V8_RETURN_SCAN];
    if (read_user(words, sizeof(words), (void *)state->sp))
        return 0;
#pragma unroll
    for (int i = 1; i < V8_RETURN_SCAN; i++) {
        if (state->sp + 8 * i >= state->bp)
            return 0;
        struct unwind_mapping *mapping = find_mapping(process, words[i] - 1);
        if (mapping && mapping->kind == MAPPING_V8_CODE && follows_call(words[i]))
            return words[i];
    }
    return 0;
}

/* A frame in V8's code: recorded as the JavaScript function it runs (v8.bpf.c), and stepped by
 * frame pointer. A leaf whose return address is on top of the stack (a builtin without a frame
 * of its own, or a function before its prologue) has not moved rbp yet: rbp is its caller's
 * frame, which is the frame that return address is in, and that return address its pc. */
static __always_inline enum step_result v8_step(struct unwind_state *state, struct unwind_process *process, u32 depth,
                                                int in_builtins)
{
    if (!state->bp_known)
        return STEP_DONE;
    if (depth == 0 && state->leaf_return) {
        struct unwind_mapping *returns_to = find_mapping(process, state->leaf_return - 1);
        u64 caller = v8_frame(state->key.tgid, state->bp, returns_to && returns_to->kind == MAPPING_V8_BUILTINS);
        enum step_result result = first_frame_pointer_step(state);
        if (caller && state->stack.len == 2 && state->stack.ips[1] == state->leaf_return)
            record_v8_frame(state, 1, caller, state->leaf_return);
        return result;
    }
    u64 value = v8_frame(state->key.tgid, state->bp, in_builtins);
    if (depth == 0 && in_builtins && v8_compiled(value)) {  /* (an interpreted frame runs in the builtins) */
        u64 returns_to = v8_builtin_return(state, process);
        if (returns_to) {
            count(COUNTER_V8_BUILTIN_RETURNS);
            state->leaf_return = returns_to;
            enum step_result result = first_frame_pointer_step(state);
            if (state->stack.len == 2 && state->stack.ips[1] == returns_to)
                record_v8_frame(state, 1, value, returns_to);
            return result;
        }
    }
    if (value)
        record_v8_frame(state, depth, value, state->pc);
    return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
}

/* Record the current frame and find its caller. */
static __always_inline enum step_result unwind_one(void *ctx, struct unwind_state *state,
                                                   struct unwind_process *process)
{
    u32 depth = state->stack.len;
    if (depth >= UNWIND_MAX_FRAMES || depth + state->python_len >= UNWIND_MAX_FRAMES)
        return STEP_DONE;  /* (the Python frames are appended after the native ones) */
    /* A return address comes from the process's stack, which holds anything once the walk leaves
     * its frames (a Go thread's beyond runtime.mcall) or the process forges them: one beyond user
     * space is not a frame, and one with bit 63 would pass for a Python frame. */
    if (state->pc >= USER_ADDRESS_END) {
        count(COUNTER_UNWIND_NOT_USER_ADDRESS);
        return STEP_DONE;
    }
    state->stack.ips[depth] = state->pc;
    state->stack.len = depth + 1;
    /* A return address follows its call: the call, one byte back, is what ran in this frame (a
     * call that ends a function would otherwise be looked up in the next one). */
    u64 pc = depth ? state->pc - 1 : state->pc;
    struct unwind_mapping *mapping = find_mapping(process, pc);
    if (!mapping) {
        count(COUNTER_UNWIND_UNKNOWN_MAPPING);
        request_maps(ctx, state->key.tgid, pc);
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    }
    if (mapping->kind == MAPPING_HOTSPOT_CODE)
        return hotspot_step(state, depth);
    if (mapping->kind != MAPPING_NATIVE)
        return v8_step(state, process, depth, mapping->kind == MAPPING_V8_BUILTINS);
    u32 file_id = mapping->file_id;
    if (!file_id)
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    struct unwind_file *file = unwind_files.lookup(&file_id);
    if (!file)
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    if (file->row_count == 0) {
        unwind_demand.atomic_increment(file_id);
        state->rows_pending = 1;
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    }
    u8 *used = unwind_used.lookup(&file_id);
    if (used && !*used)  /* (read first: a store to a shared line on every frame would cost more) */
        *used = 1;
    u64 address = pc - mapping->bias;
    if (address >> 32)
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    struct unwind_row *row = find_row(file, (u32)address);
    if (!row)
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);

    u64 cfa;
    switch (row->cfa_type) {
    case CFA_RSP:
        cfa = state->sp + row->cfa_offset;
        break;
    case CFA_RBP:
        if (!state->bp_known)
            return STEP_DONE;
        cfa = state->bp + row->cfa_offset;
        break;
    case CFA_PLT:
        /* The entry has pushed its argument once past the threshold in cfa_offset (11, or 10). */
        cfa = state->sp + 8 + (((state->pc - mapping->bias) & 15) >= row->cfa_offset ? 8 : 0);
        break;
    case CFA_RSP_DEREF:
    case CFA_RBP_DEREF: {
        if (row->cfa_type == CFA_RBP_DEREF && !state->bp_known)
            return STEP_DONE;
        u32 packed = row->cfa_offset;
        u64 slot = (row->cfa_type == CFA_RSP_DEREF ? state->sp : state->bp) + (s16)(packed & 0xffff);
        if (read_user(&cfa, sizeof(cfa), (void *)slot)) {
            count(COUNTER_UNWIND_READ_ERRORS);
            return STEP_DONE;
        }
        cfa += packed >> 16;
        break;
    }
    case CFA_END:
        return STEP_COMPLETE;
    case CFA_SIGNAL: {
        u64 saved[7];  /* rbp, rbx, rdx, rax, rcx, rsp, rip */
        if (read_user(saved, sizeof(saved), (void *)(state->sp + (s16)row->cfa_offset))) {
            count(COUNTER_UNWIND_READ_ERRORS);
            return STEP_DONE;
        }
        count(COUNTER_UNWIND_SIGNAL_FRAMES);
        state->bp = saved[0];
        state->bp_known = 1;
        state->sp = saved[5];
        state->pc = saved[6];  /* (the interrupted pc, not a return address: looked up one byte back all the same) */
        return state->pc ? STEP_CONTINUE : STEP_COMPLETE;
    }
    case CFA_UNSUPPORTED:
        count(COUNTER_UNWIND_UNSUPPORTED);
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    default:  /* CFA_UNDEFINED: a gap between the file's functions */
        return depth ? frame_pointer_step(state) : first_frame_pointer_step(state);
    }
    count(COUNTER_UNWIND_TABLE_FRAMES);
    u64 return_address;
    if (read_user(&return_address, sizeof(return_address), (void *)(cfa - 8))) {
        count(COUNTER_UNWIND_READ_ERRORS);
        return STEP_DONE;
    }
    if (row->rbp_type == RBP_AT_CFA) {
        if (read_user(&state->bp, sizeof(state->bp), (void *)(cfa + row->rbp_offset)))
            state->bp_known = 0;
    } else if (row->rbp_type == RBP_UNSUPPORTED) {
        state->bp_known = 0;
    }
    state->sp = cfa;
    state->pc = return_address;
    return return_address ? STEP_CONTINUE : STEP_COMPLETE;
}

/* Two independent hashes of the frames: the key, and a check stored with the stack. */
static __always_inline void hash_frames(struct user_stack *stack, u64 *key, u64 *check)
{
    u64 h = 0x84222325cbf29ce4ULL, c = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < UNWIND_MAX_FRAMES; i++) {
        if (i >= stack->len)
            break;
        u64 ip = stack->ips[i];
        h = (h ^ ip) * 0x100000001b3ULL;
        h ^= h >> 29;
        c = (c ^ ip) * 0xff51afd7ed558ccdULL;
        c ^= c >> 33;
    }
    h ^= stack->len;
    *key = h ? h : 1;
    *check = c;
}

/* Store `stack` in the slot's user_stacks map under its hash, which is set in *hash.  0: stored, or
 * the same stack was there already; -1 (counted): another stack holds the hash, or the map is full. */
static __always_inline int store_stack(u32 slot, struct user_stack *stack, u64 *hash)
{
    u64 check;
    hash_frames(stack, hash, &check);
    stack->check = check;
    struct user_stack *stored;
    int err;
    if (slot == 1) {
        err = user_stacks_1.insert(hash, stack);
        stored = err ? user_stacks_1.lookup(hash) : NULL;
    } else {
        err = user_stacks_0.insert(hash, stack);
        stored = err ? user_stacks_0.lookup(hash) : NULL;
    }
    if (!err || (stored && stored->check == check))
        return 0;
    count(stored ? COUNTER_UNWIND_STACK_COLLISIONS : COUNTER_UNWIND_STACK_MAP_FULL);
    return -1;
}

/* A sample the unwinder walked, sent by value (its stack could not be stored): as send_overflow,
 * with the walked frames as the user stack. */
static __always_inline int send_walked_by_value(void *ctx, struct unwind_state *state)
{
    struct stack_overflow_event *event = overflow_event(&state->key, 1);
    if (!event)
        return -1;
    event->user_error = 0;
    event->user_leaf_return = 0;
    /* All the frames, used or not: a copy of constant size is one the verifier can check. */
    bpf_probe_read_kernel(event->user_ips, sizeof(state->stack.ips), state->stack.ips);
    event->user_len = state->stack.len * 8;
    u32 klen = stack_by_value(ctx, state->key.kernel_stack_id, event->kernel_ips, 0, &event->kernel_error);
    event->kernel_len = klen;
    klen &= 1023;
    return stack_overflow.perf_submit(ctx, event, __builtin_offsetof(struct stack_overflow_event, kernel_ips) + klen);
}

/* The Python frames python_walk recorded, after the native frames. */
static __always_inline void append_python_frames(struct unwind_state *state)
{
    for (int i = 0; i < PYTHON_MAX_FRAMES; i++) {
        if (i >= state->python_len)
            break;
        u32 depth = state->stack.len;
        OPAQUE(depth);  /* else clang indexes by the first length plus i, which the verifier cannot bound */
        if (depth >= UNWIND_MAX_FRAMES)
            break;
        state->stack.ips[depth] = state->python[i];
        state->stack.len = depth + 1;
    }
}

#ifdef OFF_CPU
static __always_inline void keep_walked_wait(struct unwind_state *state);  /* off_cpu.bpf.c */
#ifdef LOCK_WAITS
static __always_inline void keep_walked_waker(struct unwind_state *state);
#endif
#endif
#ifdef MEMORY_PROFILING
static __always_inline void memory_walked(void *ctx, struct unwind_state *state);  /* memory.bpf.c */
#endif

/* Store the walked stack in the slot's user_stacks map and count the sample under its hash (an
 * off-CPU walk instead leaves the stack with the thread's wait, for when it returns; a waker's
 * walk stores it and leaves its hash with the wait the waker ends). */
static __always_inline void finish_walk(void *ctx, struct unwind_state *state, int complete, int walk_set)
{
    count(COUNTER_UNWIND_SAMPLES);
    if (complete)
        count(COUNTER_UNWIND_COMPLETE);
    else if (state->stack.len >= UNWIND_MAX_FRAMES)
        count(COUNTER_UNWIND_TRUNCATED);
    state->stack.complete = complete;
    append_python_frames(state);
#ifdef MEMORY_PROFILING
    if (walk_set == WALK_MEMORY) {
        memory_walked(ctx, state);
        return;
    }
#endif
#ifdef OFF_CPU
    if (walk_set == WALK_OFF_CPU) {
#ifdef LOCK_WAITS
        if (state->wakee) {  /* a waker's stack, for the wait it ends */
            keep_walked_waker(state);
            return;
        }
#endif
        keep_walked_wait(state);
        return;
    }
#endif
    u64 key;
    int err = store_stack(state->slot, &state->stack, &key);
    int flipped = slot_flipped(state->slot);
    if (err || state->key.kernel_stack_id == -PROFILE_EEXIST || flipped) {
        if (send_walked_by_value(ctx, state) == 0) {
            count(COUNTER_STACK_OVERFLOW_SENT);
            return;
        }
        count(COUNTER_STACK_OVERFLOW_ERRORS);
        if (flipped)
            return;  /* (as on_cpu_sample: lost, counted, rather than misattributed) */
        if (err) {  /* counted here without its user stack */
            state->key.user_stack_id = -PROFILE_EEXIST;
            key = 0;
        }
    }
    state->key.user_stack_hash = key;
    int failed = state->slot == 1 ? add_sample_1(&state->key, 1) : add_sample_0(&state->key, 1);
    if (failed)
        count(COUNTER_MAP_FULL);
}

/* Start a walk: on_cpu_sample's (and leave_cpu's) last act when the process has unwind tables.
 * Returns only if the walk could not start (then the caller walks by frame pointer). */
static __always_inline void start_walk(void *ctx, struct pt_regs *interrupted, struct sample_key *key, u32 slot,
                                       int walk_set)
{
    if (!unwind_processes.lookup(&key->tgid))
        return;
    struct unwind_state *state = walk_state(walk_set);
    if (!state)
        return;
    if (user_registers(interrupted, &state->pc, &state->sp, &state->bp))
        return;
    __builtin_memcpy(&state->key, key, sizeof(*key));
    state->key.user_stack_id = STACK_HASHED;
    state->key.user_leaf_return = 0;
    state->slot = slot;
    state->tail_calls = 0;
    state->bp_known = 1;
    state->leaf_return = user_leaf_return(interrupted);
    state->stack.len = 0;
    state->python_len = 0;
    state->python_frame = 0;
    state->rows_pending = 0;
    /* A Python process has its Python frames recorded first; python_walk goes on to unwind_step. */
    walk_next(ctx, walk_set, python_processes.lookup(&key->tgid) ? PYTHON_WALK_PROGRAM : UNWIND_STEP_PROGRAM);
    count(COUNTER_UNWIND_TAIL_CALL_FAILED);
}

static __always_inline int unwind_step_body(void *ctx, int walk_set)
{
    struct unwind_state *state = walk_state(walk_set);
    if (!state)
        return 0;
    struct unwind_process *process = unwind_processes.lookup(&state->key.tgid);
    enum step_result result = STEP_DONE;
    /* (Off a CPU the leaf is in a call, never at a frame's edge.) */
    if (state->stack.len == 0 && state->tail_calls == 0)
        state->hotspot_leaf = walk_set == WALK_ON_CPU ? hotspot_leaf(state) : 0;
    if (process) {
        for (int i = 0; i < UNWIND_FRAMES_PER_CALL; i++) {
            result = unwind_one(ctx, state, process);
            if (result != STEP_CONTINUE)
                break;
        }
    }
    if (result == STEP_CONTINUE && state->stack.len < UNWIND_MAX_FRAMES &&
        state->tail_calls < UNWIND_MAX_TAIL_CALLS) {
        state->tail_calls++;
        walk_next(ctx, walk_set, UNWIND_STEP_PROGRAM);
        count(COUNTER_UNWIND_TAIL_CALL_FAILED);  /* and the stack ends here */
    }
    finish_walk(ctx, state, result == STEP_COMPLETE, walk_set);
    return 0;
}

int unwind_step(struct bpf_perf_event_data *ctx)
{
    return unwind_step_body(ctx, WALK_ON_CPU);
}

#ifdef OFF_CPU
int unwind_step_off_cpu(struct bpf_raw_tracepoint_args *ctx)
{
    return unwind_step_body(ctx, WALK_OFF_CPU);
}
#endif

#ifdef MEMORY_PROFILING
int unwind_step_memory(struct pt_regs *ctx)
{
    return unwind_step_body(ctx, WALK_MEMORY);
}
#endif
