/* Python frames: for a process user space found CPython in (python_processes), the sampled
 * thread's own PyThreadState is found and its frame chain recorded, innermost first, as tagged
 * values (profile.h, RUNTIME_FRAME_TAG) in unwind_state.python.  Pasted into profile.bpf.c after
 * unwind.bpf.c (see there): start_walk tail-calls python_walk first, python_walk then the native
 * unwinder, and finish_walk appends these frames after the native ones.  User space puts each
 * eval loop call's Python frames in place of that call's native frame.
 *
 * The thread: PyThreadState.thread_id is the thread's pthread_self(), which on x86-64 is the
 * base of its TLS block, task->thread.fsbase (TASK_FSBASE_OFFSET into task_struct, from the
 * kernel's BTF).  The tid -> PyThreadState match is kept in python_threads and checked each time. */

#define PYTHON_FRAMES_PER_CALL 32
#define PYTHON_MAX_THREADS 64  /* PyThreadStates searched for the sampled thread */

BPF_TABLE("lru_hash", u32, u64, python_threads, 4096);  /* tid -> its PyThreadState */

static __always_inline int read_pointer(u64 *value, u64 address)
{
    if (read_user(value, sizeof(*value), (void *)address)) {
        count(COUNTER_PYTHON_READ_ERRORS);
        return -1;
    }
    return 0;
}

/* The TLS base of the running thread: what pthread_self() returns in it. */
static __always_inline u64 current_fsbase(void)
{
    u64 fsbase = 0;
    u64 task = bpf_get_current_task();
    bpf_probe_read_kernel(&fsbase, sizeof(fsbase), (void *)(task + TASK_FSBASE_OFFSET));
    return fsbase;
}

static __always_inline u64 thread_state_of(struct python_process *py, u32 tid)
{
    u64 fsbase = current_fsbase();
    if (!fsbase)
        return 0;
    u64 thread_id;
    u64 *known = python_threads.lookup(&tid);
    if (known && read_user(&thread_id, sizeof(thread_id), (void *)(*known + py->thread_id)) == 0 &&
        thread_id == fsbase)
        return *known;
    u64 interp, tstate;
    if (read_pointer(&interp, py->interpreters) || !interp || read_pointer(&tstate, interp + py->interp_threads))
        return 0;
    for (int i = 0; i < PYTHON_MAX_THREADS && tstate; i++) {
        if (read_pointer(&thread_id, tstate + py->thread_id))
            return 0;
        if (thread_id == fsbase) {
            python_threads.update(&tid, &tstate);
            return tstate;
        }
        if (read_pointer(&tstate, tstate + py->thread_next))
            return 0;
    }
    return 0;
}

/* The thread's innermost frame. */
static __always_inline u64 current_python_frame(struct python_process *py, u64 tstate)
{
    u64 frame;
    if (read_pointer(&frame, tstate + py->thread_frame))
        return 0;
    if (py->cframe_frame != PYTHON_NO_OFFSET && frame && read_pointer(&frame, frame + py->cframe_frame))
        return 0;
    return frame;
}

static __always_inline void mark_last_of_call(struct unwind_state *state)
{
    u32 last = state->python_len - 1;
    if (last < PYTHON_MAX_FRAMES)
        state->python[last] |= PYTHON_FRAME_LAST_OF_CALL;
}

/* Record one frame and move to its caller; 0 when the chain ends or cannot be read. */
static __always_inline u64 record_python_frame(struct unwind_state *state, struct python_process *py, u64 frame)
{
    u64 code, previous, instruction = 0;
    if (read_pointer(&code, frame + py->frame_code) || read_pointer(&previous, frame + py->frame_previous))
        return 0;
    u64 last_of_call = PYTHON_FRAME_LAST_OF_CALL;
    if (py->layout == PYTHON_INTERPRETER_FRAMES) {
        u8 owner = 0;
        if (read_user(&owner, sizeof(owner), (void *)(frame + py->frame_owner))) {
            count(COUNTER_PYTHON_READ_ERRORS);
            return 0;
        }
        if (py->owner_kind == PYTHON_OWNER_BYTE && owner == py->owner_c_stack) {
            /* The shim an eval loop call starts with: the frame before it was that call's last. */
            mark_last_of_call(state);
            return previous;
        }
        last_of_call = py->owner_kind == PYTHON_OWNER_IS_ENTRY && owner ? PYTHON_FRAME_LAST_OF_CALL : 0;
        u64 pointer;
        if (read_pointer(&pointer, frame + py->frame_instruction))
            return 0;
        u64 first = code + py->code_instructions;
        instruction = pointer > first ? (pointer - first) / 2 : 0;
    } else {
        s32 lasti = 0;
        if (read_user(&lasti, sizeof(lasti), (void *)(frame + py->frame_instruction))) {
            count(COUNTER_PYTHON_READ_ERRORS);
            return 0;
        }
        instruction = lasti > 0 ? lasti : 0;
    }
    if (instruction > PYTHON_INSTRUCTION_MAX)
        instruction = PYTHON_INSTRUCTION_MAX;
    s32 first_line = 0;
    if (read_user(&first_line, sizeof(first_line), (void *)(code + py->code_first_line))) {
        count(COUNTER_PYTHON_READ_ERRORS);
        return 0;
    }
    u32 index = state->python_len;
    if (index >= PYTHON_MAX_FRAMES)  /* the caller checks: this is for the verifier */
        return 0;
    state->python[index] = RUNTIME_FRAME_TAG | last_of_call | instruction << PYTHON_INSTRUCTION_SHIFT |
                           (code & PYTHON_ADDRESS_MASK) | ((u64)first_line & PYTHON_FIRST_LINE_MASK);
    state->python_len = index + 1;
    count(COUNTER_PYTHON_FRAMES);
    return previous;
}

static __always_inline int python_walk_body(void *ctx, int walk_set)
{
    struct unwind_state *state = walk_state(walk_set);
    if (!state)
        return 0;
    struct python_process *py = python_processes.lookup(&state->key.tgid);
    if (py) {
        u64 frame = state->python_frame;
        if (state->python_len == 0 && !frame) {  /* the first of this sample's calls */
            count(COUNTER_PYTHON_SAMPLES);
            u64 tstate = thread_state_of(py, state->key.pid);
            if (tstate)
                frame = current_python_frame(py, tstate);
            else
                count(COUNTER_PYTHON_NO_THREAD);
        }
        for (int i = 0; i < PYTHON_FRAMES_PER_CALL; i++) {
            if (!frame || state->python_len >= PYTHON_MAX_FRAMES)
                break;
            frame = record_python_frame(state, py, frame);
        }
        state->python_frame = frame;
        if (frame && state->python_len < PYTHON_MAX_FRAMES && state->tail_calls < UNWIND_MAX_TAIL_CALLS) {
            state->tail_calls++;
            walk_next(ctx, walk_set, PYTHON_WALK_PROGRAM);
        }
        if (frame)
            count(COUNTER_PYTHON_TRUNCATED);
    }
    state->python_frame = 0;
    state->tail_calls++;
    walk_next(ctx, walk_set, UNWIND_STEP_PROGRAM);
    count(COUNTER_UNWIND_TAIL_CALL_FAILED);
    finish_walk(ctx, state, 0, walk_set);
    return 0;
}

int python_walk(struct bpf_perf_event_data *ctx)
{
    return python_walk_body(ctx, WALK_ON_CPU);
}

#ifdef OFF_CPU
int python_walk_off_cpu(struct bpf_raw_tracepoint_args *ctx)  /* the raw tracepoint copy (see unwind.bpf.c) */
{
    return python_walk_body(ctx, WALK_OFF_CPU);
}
#endif

#ifdef MEMORY_PROFILING
int python_walk_memory(struct pt_regs *ctx)  /* the uprobes' copy (see unwind.bpf.c) */
{
    return python_walk_body(ctx, WALK_MEMORY);
}
#endif
