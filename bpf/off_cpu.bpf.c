/* Off-CPU profiling: where threads wait, and for how long.  Pasted into profile.bpf.c (see
 * unwind.bpf.c's header for why) when user space sets -DOFF_CPU=1.
 *
 * One program on the sched_switch tracepoint, which runs as the thread leaving the CPU:
 *
 * - Leaving: for a share of the switches (OFF_CPU_THRESHOLD out of 2^32, the off_cpu_threshold
 *   setting, a probability), the thread's stacks are taken there, where it blocked: the kernel
 *   stack, and the user stack walked as a CPU sample's is (the unwinder's raw tracepoint copies,
 *   WALK_OFF_CPU, or the kernel's frame-pointer walk).  They wait in off_cpu_waits, by value,
 *   with the time.
 * - Coming back (the same tracepoint, for the switch that picks the thread): the time it was
 *   away is added to an ORIGIN_OFF_CPU count under its stacks, which are stored by their hash
 *   in the slot that is active then, as an unwound stack is (user_stacks_N).  So double
 *   buffering holds for a wait however long, across any number of reports.
 *
 * (The kernel offers no hook in the returning thread's own context here: this kernel is built
 * without kprobes, and fentry programs are refused.  A thread's stacks do not change while it
 * is off the CPU, so taking them as it leaves is the same.)
 *
 * Settings (cflags): OFF_CPU_THRESHOLD, OFF_CPU_THREADS (threads away at once that can be
 * tracked), TASK_PID_OFFSET (where task_struct keeps a thread's id, from the kernel's BTF).
 */

#ifndef TASK_PID_OFFSET
#error "TASK_PID_OFFSET: where task_struct keeps pid, from the kernel's BTF (user space passes it)"
#endif
#ifndef OFF_CPU_THRESHOLD
#define OFF_CPU_THRESHOLD 0xffffffffU
#endif
#ifndef OFF_CPU_THREADS
#define OFF_CPU_THREADS 16384
#endif
#define OFF_CPU_TASK_DEAD 0x80  /* TASK_DEAD: a thread's last switch, from which it never returns */
/* Kernel frames kept: what bpf_get_stack() gives (PERF_MAX_STACK_DEPTH), if a stack holds that many. */
#if UNWIND_MAX_FRAMES < PROFILE_MAX_STACK_DEPTH
#define OFF_CPU_KERNEL_FRAMES UNWIND_MAX_FRAMES
#else
#define OFF_CPU_KERNEL_FRAMES PROFILE_MAX_STACK_DEPTH
#endif

/* A thread off the CPU whose switch was recorded. */
struct off_cpu_wait {
    u64 left_ns;              /* bpf_ktime_get_ns() when it left */
    struct sample_key key;    /* its hashes and ids, with the origin ORIGIN_OFF_CPU */
    struct user_stack kernel;
    struct user_stack user;
};

/* tid -> its wait.  Allocated as threads leave (no preallocation: a wait holds two stacks of
 * UNWIND_MAX_FRAMES, 2 KiB at the default 128).  Only a thread's own switches touch its entry:
 * it cannot be switched back in on another CPU before the switch that records it has ended. */
BPF_F_TABLE("hash", u32, struct off_cpu_wait, off_cpu_waits, OFF_CPU_THREADS, BPF_F_NO_PREALLOC);
/* Where a wait is put together before it is stored (too big for the BPF stack). */
BPF_PERCPU_ARRAY(off_cpu_scratch, struct off_cpu_wait, 1);

/* Store the finished wait under the thread's id, until it returns. */
static __always_inline void keep_wait(struct off_cpu_wait *wait)
{
    u32 tid = wait->key.pid;
    if (off_cpu_waits.update(&tid, wait) == 0)
        count(COUNTER_OFF_CPU_SWITCHES);
    else
        count(COUNTER_OFF_CPU_WAITS_FULL);
}

/* The end of an off-CPU walk (unwind.bpf.c's finish_walk): the walked stack is the wait's user stack. */
static __always_inline void keep_walked_wait(struct unwind_state *state)
{
    u32 zero = 0;
    struct off_cpu_wait *wait = off_cpu_scratch.lookup(&zero);
    if (!wait)
        return;
    wait->key.user_stack_id = STACK_HASHED;
    wait->key.user_leaf_return = 0;  /* the walk put the leaf's caller in place itself */
    bpf_probe_read_kernel(&wait->user, sizeof(wait->user), &state->stack);  /* too big for an inline copy */
    keep_wait(wait);
}

/* The thread leaving the CPU (current) at `now`: note its stacks and the time, for a share of switches. */
static __always_inline void leave_cpu(struct bpf_raw_tracepoint_args *ctx, u64 now)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 pid = id;
    if (pid == 0 || profiling_paused())  /* the idle task; an interval not drawn (its waits still end) */
        return;
#ifdef TARGETING
    if (!target_tgids.lookup(&tgid))
        return;
#endif
    /* An exiting thread's last switch: it never comes back, and its wait would stay forever. */
    if (ctx->args[3] & OFF_CPU_TASK_DEAD)
        return;
    if (bpf_get_prandom_u32() > OFF_CPU_THRESHOLD)
        return;
    u32 zero = 0;
    struct off_cpu_wait *wait = off_cpu_scratch.lookup(&zero);
    if (!wait)
        return;
    wait->left_ns = now;
    __builtin_memset(&wait->key, 0, sizeof(wait->key));
    wait->key.tgid = tgid;
    wait->key.pid = pid;
    wait->key.process_start = process_start();
    wait->key.origin = ORIGIN_OFF_CPU;
    bpf_get_current_comm(&wait->key.comm, sizeof(wait->key.comm));
    announce(ctx, &wait->key);
    read_thread_context(&wait->key);  /* (current is still the thread leaving the CPU) */

    long n = bpf_get_stack(ctx, wait->kernel.ips, OFF_CPU_KERNEL_FRAMES * sizeof(u64), 0);
    wait->kernel.len = n > 0 ? n / sizeof(u64) : 0;
    wait->kernel.complete = 1;
    wait->key.kernel_stack_id = n > 0 ? STACK_HASHED : (n < 0 ? n : -PROFILE_EFAULT);

    /* A process with unwind tables: the unwinder walks the user stack, and keep_walked_wait ends
     * the walk (a tail call: no return).  Any other: the kernel's frame-pointer walk. */
    start_walk(ctx, NULL, &wait->key, 0, WALK_OFF_CPU);
    n = bpf_get_stack(ctx, wait->user.ips, UNWIND_MAX_FRAMES * sizeof(u64), BPF_F_USER_STACK);
    wait->user.len = n > 0 ? n / sizeof(u64) : 0;
    wait->user.complete = 0;
    if (n > 0) {
        wait->key.user_stack_id = STACK_HASHED;
        wait->key.user_leaf_return = user_leaf_return(NULL);
    } else {
        wait->key.user_stack_id = n < 0 ? n : -PROFILE_EFAULT;  /* a kernel thread has no user stack */
    }
    keep_wait(wait);
}

/* A wait whose stacks could not be stored, sent by value as a collided CPU sample is. */
static __always_inline int send_wait_by_value(struct bpf_raw_tracepoint_args *ctx, struct off_cpu_wait *wait, u64 away)
{
    struct stack_overflow_event *event = overflow_event(&wait->key, away);
    if (!event)
        return -1;
    event->user_leaf_return = wait->key.user_leaf_return;
    event->user_error = wait->key.user_stack_id == STACK_HASHED ? 0 : wait->key.user_stack_id;
    event->kernel_error = wait->key.kernel_stack_id == STACK_HASHED ? 0 : wait->key.kernel_stack_id;
    /* Constant sizes, which the verifier can check; the lengths say what is used. */
    bpf_probe_read_kernel(event->user_ips, sizeof(wait->user.ips), wait->user.ips);
    bpf_probe_read_kernel(event->kernel_ips, OFF_CPU_KERNEL_FRAMES * sizeof(u64), wait->kernel.ips);
    event->user_len = wait->user.len * 8;
    u32 klen = wait->kernel.len;
    if (klen > OFF_CPU_KERNEL_FRAMES)
        klen = OFF_CPU_KERNEL_FRAMES;
    klen *= sizeof(u64);
    OPAQUE(klen);
    klen &= 1023;  /* for the verifier: at most 1016 already */
    event->kernel_len = klen;
    return stack_overflow.perf_submit(ctx, event, __builtin_offsetof(struct stack_overflow_event, kernel_ips) + klen);
}

/* The thread the CPU switches to (`next`) at `now`: if its leaving was recorded, count the time away. */
static __always_inline void return_to_cpu(struct bpf_raw_tracepoint_args *ctx, u64 now)
{
    u32 tid = 0;
    bpf_probe_read_kernel(&tid, sizeof(tid), (void *)(ctx->args[2] + TASK_PID_OFFSET));
    if (tid == 0)
        return;
    struct off_cpu_wait *wait = off_cpu_waits.lookup(&tid);
    if (!wait)
        return;
    u64 away = now - wait->left_ns;
    count(COUNTER_OFF_CPU_SAMPLES);

    u32 zero = 0;
    u32 *active = active_slot.lookup(&zero);
    u32 slot = active ? *active : 0;
    int failed = 0;
    if (wait->key.kernel_stack_id == STACK_HASHED)
        failed |= store_stack(slot, &wait->kernel, &wait->key.kernel_stack_hash);
    if (wait->key.user_stack_id == STACK_HASHED)
        failed |= store_stack(slot, &wait->user, &wait->key.user_stack_hash);
    if (!failed && !slot_flipped(slot)) {
        int err = slot == 1 ? add_sample_1(&wait->key, away) : add_sample_0(&wait->key, away);
        if (err)
            count(COUNTER_MAP_FULL);
    } else if (send_wait_by_value(ctx, wait, away) == 0) {
        count(COUNTER_STACK_OVERFLOW_SENT);
    } else {
        count(COUNTER_OFF_CPU_LOST);
    }
    off_cpu_waits.delete(&tid);
}

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state), attached by user space (receivers/profiling/kernel/sampler.py). */
int off_cpu_switch(struct bpf_raw_tracepoint_args *ctx)
{
    /* One time for both threads: the switch.  (What this program costs is then counted once, in
     * the leaving thread's wait, not in both threads' or in neither's.) */
    u64 now = bpf_ktime_get_ns();
    return_to_cpu(ctx, now);
    leave_cpu(ctx, now);  /* last: it may end in a tail call */
    return 0;
}
