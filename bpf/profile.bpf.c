/* CPU profiler: a perf_event program run by the software cpu-clock event on every CPU.
 *
 * Compiled by BCC.  Settings arrive as cflags (receivers/profiling/kernel/settings.py makes them):
 *   -DSTACK_STORAGE_SIZE=n     entries in each of the two stack maps
 *   -DCOUNT_MAP_SIZE=n         entries in each of the two count maps
 *   -DKNOWN_PROCESSES_SIZE=n   entries in the LRU of tgids already announced to user space
 *   -DUNWIND_*                 the unwinder's sizes (see unwind.h)
 *   -DOFF_CPU=1 ...            off-CPU profiling (off_cpu.bpf.c)
 *   -DMEMORY_PROFILING=1 ...   sampled allocations through OpenTelemetry's USDT probes, and
 *                              with -DLIVE_HEAP=1 the live heap (memory.bpf.c)
 *   -DPROBABILISTIC=1          samples are taken only while profiling_on[0] is 1 (user space
 *                              draws it every probabilistic_interval: probabilistic.py)
 *   -DTASK_GROUP_LEADER_OFFSET=n, -DTASK_START_BOOTTIME_OFFSET=n
 *                              where task_struct keeps these (from the kernel's BTF), which
 *                              date a sample's process (sample_key.process_start)
 *   -I<this directory>         for profile.h
 *
 * Double buffering: samples are counted in counts_0 or counts_1, chosen by active_slot[0], and
 * their stacks stored in the stack map of the same slot (stack_traces_0 or stack_traces_1).
 * Every reporter interval user space flips active_slot, then reads and deletes the other count
 * map (BPF_MAP_LOOKUP_AND_DELETE_BATCH), reads the stacks it refers to, and empties that slot's
 * stack map.  A stack id is only a hash bucket: were one stack map shared, emptying a bucket the
 * drained map used could pull it from under a key just counted in the active map, and a new
 * stack stored there would give that key the wrong frames.  With a stack map per slot, nothing
 * writes to the drained slot's maps until the next flip.  A program that read the old slot just
 * before the flip usually finishes within microseconds, long before user space drains it (it waits
 * FLIP_GRACE_S), but a virtual CPU can be stopped for longer in the middle of one: its
 * count would land after the drain, its stack ids pointing at buckets the drain emptied and other
 * stacks then took.  So each program looks at the slot again just before it counts: one that was
 * retired meanwhile sends the sample by value instead (slot_flipped), which leaves only the few
 * instructions between that look and the count to the grace period.
 */
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include <linux/sched.h>
#include "profile.h"

/* bpf_probe_read_user by another name. BCC's rewriter looks each call of that name up in
 * /proc/kallsyms (whether an old kernel lacks the helper), which parses the whole symbol table
 * in the middle of the compile: 0.4 s of the agent's start-up and the memory of every kernel
 * symbol. The helper is the kernel's since 5.5, which every kernel this runs on is past. */
static long (*read_user)(void *dst, u32 size, const void *unsafe_ptr) = (void *)BPF_FUNC_probe_read_user;

#ifndef STACK_STORAGE_SIZE
#define STACK_STORAGE_SIZE 16384
#endif
#ifndef COUNT_MAP_SIZE
#define COUNT_MAP_SIZE 16384
#endif
#ifndef KNOWN_PROCESSES_SIZE
#define KNOWN_PROCESSES_SIZE 8192
#endif

#define PROFILE_EFAULT 14
#define PROFILE_EEXIST 17

BPF_HASH(counts_0, struct sample_key, u64, COUNT_MAP_SIZE);
BPF_HASH(counts_1, struct sample_key, u64, COUNT_MAP_SIZE);
BPF_ARRAY(active_slot, u32, 1);
BPF_STACK_TRACE(stack_traces_0, STACK_STORAGE_SIZE);
BPF_STACK_TRACE(stack_traces_1, STACK_STORAGE_SIZE);
BPF_PERCPU_ARRAY(counters, u64, PROFILE_NR_COUNTERS);
BPF_TABLE("lru_hash", u32, u64, known_tgids, KNOWN_PROCESSES_SIZE);  /* tgid -> its process_start */
BPF_PERF_OUTPUT(new_processes);
/* Samples whose stack collided in the stack map, with both stacks by value (see on_cpu_sample).
 * The event is too big for the 512-byte BPF stack: it is built in a per-CPU scratch slot (the
 * programs that use it do not nest on a CPU: the cpu-clock one runs in an interrupt, off_cpu.bpf.c's
 * in the scheduler with interrupts off). */
BPF_PERF_OUTPUT(stack_overflow);

#ifdef TARGETING
/* Process targeting (receivers/profiling/processes/targeting.py): only the tgids in target_tgids are
 * sampled, and the others cost this one lookup.  User space keeps the set: it hears of every
 * exec through exec_events, and a process forked by a target is a target from its first
 * instruction (sched_process_fork), before user space could hear of it. */
BPF_HASH(target_tgids, u32, u8, TARGET_TGIDS_SIZE);
BPF_PERF_OUTPUT(exec_events);
#endif
BPF_PERCPU_ARRAY(overflow_scratch, struct stack_overflow_event, 1);
#ifdef PROBABILISTIC
BPF_ARRAY(profiling_on, u32, 1);
#endif

/* Probabilistic profiling: whether this interval is one user space drew to profile. */
static __always_inline int profiling_paused(void)
{
#ifdef PROBABILISTIC
    u32 index = 0;
    u32 *on = profiling_on.lookup(&index);
    return !on || !*on;
#else
    return 0;
#endif
}

static __always_inline void count(u32 index)
{
    u64 *value = counters.lookup(&index);
    if (value)
        *value += 1;  /* per-CPU slot; a raw tracepoint interrupted by the cpu-clock program may lose one */
}

/* Which process the running thread belongs to, as sample_key.process_start: its thread group
 * leader's start_boottime, the time /proc/PID/stat's starttime shows in clock ticks (exec keeps
 * it, de_thread() too).  A pid names a process only while it lives: the next process to take it
 * starts later.  Two loads through the BTF pointer bpf_get_current_task_btf() gives (the verifier
 * checks the offsets against the running kernel's BTF, which they come from), no helper call. */
static __always_inline u64 process_start(void)
{
#if defined(TASK_GROUP_LEADER_OFFSET) && defined(TASK_START_BOOTTIME_OFFSET)
    struct task_struct *task = bpf_get_current_task_btf();
    u64 leader = *(u64 *)((char *)task + TASK_GROUP_LEADER_OFFSET);
    return *(u64 *)((char *)leader + TASK_START_BOOTTIME_OFFSET);
#else
    return 0;  /* unknown: user space attributes the sample by its pid alone */
#endif
}

static __always_inline void count_stack_error(s32 stack_id, u32 efault, u32 collision, u32 other)
{
    if (stack_id >= 0)
        return;
    if (stack_id == -PROFILE_EFAULT)
        count(efault);
    else if (stack_id == -PROFILE_EEXIST)
        count(collision);
    else
        count(other);
}

/* Add `amount` (one sample, or off-CPU nanoseconds) to counts_N[key].  Return 0, or the error of
 * the failed insert (map full).
 * Written out once per map: BCC rewrites map calls only when the map is named literally (not
 * through a macro or a pointer), so the two copies must stay identical. */
static __always_inline int add_sample_0(struct sample_key *key, u64 amount)
{
    u64 *value = counts_0.lookup(key);
    if (value) {
        __sync_fetch_and_add(value, amount);
        return 0;
    }
    int err = counts_0.insert(key, &amount);
    if (err == -PROFILE_EEXIST) {  /* another CPU inserted the same key in between */
        value = counts_0.lookup(key);
        if (value) {
            __sync_fetch_and_add(value, amount);
            return 0;
        }
    }
    return err;
}

static __always_inline int add_sample_1(struct sample_key *key, u64 amount)
{
    u64 *value = counts_1.lookup(key);
    if (value) {
        __sync_fetch_and_add(value, amount);
        return 0;
    }
    int err = counts_1.insert(key, &amount);
    if (err == -PROFILE_EEXIST) {  /* another CPU inserted the same key in between */
        value = counts_1.lookup(key);
        if (value) {
            __sync_fetch_and_add(value, amount);
            return 0;
        }
    }
    return err;
}

/* Whether the instruction before `ret` is a call, as before a return address. x86-64 only. */
static __always_inline int follows_call(u64 ret)
{
#ifdef CONFIG_X86_64
    u8 code[6] = {};
    if (read_user(code, sizeof(code), (void *)(ret - 6)))
        return 0;
    return code[1] == 0xe8 ||                               /* call rel32 */
           (code[0] == 0xff && code[1] == 0x15) ||          /* call *disp32(%rip) */
           (code[4] == 0xff && (code[5] & 0xf8) == 0xd0);   /* call *%reg */
#else
    return 0;
#endif
}

/* The return address at the top of the user stack, if there is one there (see
 * sample_key.user_leaf_return).  `interrupted`: the registers of the sample, or NULL when the
 * task is in the kernel by its own doing (off-CPU: it is calling schedule()).  x86-64 only:
 * elsewhere the caller of a leaf is in a register. */
static __always_inline u64 user_leaf_return(struct pt_regs *interrupted)
{
#ifdef CONFIG_X86_64
    u64 sp;
    if (interrupted && (interrupted->cs & 3) == 3) {  /* interrupted in user mode */
        sp = interrupted->sp;
    } else {  /* in the kernel on behalf of the task (syscall, fault): its saved user regs */
        struct task_struct *task = bpf_get_current_task_btf();
        struct pt_regs *uregs = (struct pt_regs *)bpf_task_pt_regs(task);
        if (!uregs)
            return 0;
        if (bpf_probe_read_kernel(&sp, sizeof(sp), &uregs->sp))
            return 0;
        if (sp == 0)  /* kernel thread */
            return 0;
    }
    u64 ret = 0;
    if (read_user(&ret, sizeof(ret), (void *)sp))
        return 0;
    /* Not a code address: NULL page, kernel half, or a pointer into this stack (saved rbp). */
    if (ret < 4096 || ret >= (1ULL << 47))
        return 0;
    if (ret + (8ULL << 20) > sp && ret < sp + (8ULL << 20))
        return 0;
    return follows_call(ret) ? ret : 0;
#else
    return 0;
#endif
}

/* The bytes of a user stack the kernel walked by frame pointer (bpf_get_stack() with
 * BPF_F_USER_STACK returned `bytes` into `ips`) up to its first "return address" beyond user
 * space, counted as the unwinder counts its own stop there.  The kernel stores whatever it reads
 * from the process's stack (a Go thread's beyond runtime.mstart, a forged one), and a value with
 * bit 63 would pass for a runtime's frame (RUNTIME_FRAME_TAG) in a stack user space cannot tell
 * from one the unwinder walked.  `max_frames`: the size of ips. */
static __always_inline long within_user_space(u64 *ips, long bytes, u32 max_frames)
{
    if (bytes <= 0)
        return bytes;
    u64 len = bytes / sizeof(u64);
    for (u32 i = 0; i < max_frames; i++) {
        u32 at = i;
        asm volatile("" : "+r"(at));  /* (else clang ends the loop at len alone, which the verifier cannot bound) */
        if (at >= len || at >= max_frames)
            break;
        if (ips[at] >= USER_ADDRESS_END) {
            count(COUNTER_UNWIND_NOT_USER_ADDRESS);
            return at * sizeof(u64);
        }
    }
    return bytes;
}

/* The current task's user stack by the kernel's frame-pointer walk into `ips` (UNWIND_MAX_FRAMES
 * of them), cut by within_user_space: the bytes used, or bpf_get_stack()'s error.  Every user
 * stack the kernel walks for the unwinder's maps (a wait's, a waker's, a memory sample's) comes
 * through here. */
static __always_inline long kernel_walked_user_stack(void *ctx, u64 *ips)
{
    return within_user_space(ips, bpf_get_stack(ctx, ips, UNWIND_MAX_FRAMES * sizeof(u64), BPF_F_USER_STACK), UNWIND_MAX_FRAMES);
}

/* A stack that get_stackid() could not store (-EEXIST) or stored (id >= 0), read again by value
 * into ips; any other error is passed on.  Return the bytes used (0 on error, set in *error). */
static __always_inline u32 stack_by_value(struct bpf_perf_event_data *ctx, s32 stack_id, u64 *ips,
                                          u64 flags, s32 *error)
{
    *error = 0;
    if (stack_id < 0 && stack_id != -PROFILE_EEXIST) {
        *error = stack_id;
        return 0;
    }
    long n = bpf_get_stack(ctx, ips, PROFILE_MAX_STACK_DEPTH * sizeof(u64), flags);
    if (flags & BPF_F_USER_STACK)
        n = within_user_space(ips, n, PROFILE_MAX_STACK_DEPTH);
    if (n < 0) {
        *error = n;
        return 0;
    }
    return n;
}

/* The per-CPU stack_overflow event with the sample's thread, origin, span and `value` filled in
 * from its key; the senders fill in the stacks.  NULL if the scratch slot cannot be had. */
static __always_inline struct stack_overflow_event *overflow_event(struct sample_key *key, u64 value)
{
    u32 zero = 0;
    struct stack_overflow_event *event = overflow_scratch.lookup(&zero);
    if (!event)
        return NULL;
    event->tgid = key->tgid;
    event->pid = key->pid;
    event->process_start = key->process_start;
    event->value = value;
    event->origin = key->origin;
    event->device = key->device;
    __builtin_memcpy(event->comm, key->comm, sizeof(event->comm));
    __builtin_memcpy(event->trace_id, key->trace_id, sizeof(event->trace_id));
    __builtin_memcpy(event->span_id, key->span_id, sizeof(event->span_id));
    return event;
}

/* Whether user space retired `slot` since this program read it (see the top of this file). */
static __always_inline int slot_flipped(u32 slot)
{
    u32 zero = 0;
    u32 *active = active_slot.lookup(&zero);
    if (!active || *active == slot)
        return 0;
    count(COUNTER_SLOT_FLIPPED);
    return 1;
}

/* Send a sample whose kernel or user stack collided, with both stacks by value, through the
 * stack_overflow perf buffer.  Return 0 if sent. */
static __always_inline int send_overflow(struct bpf_perf_event_data *ctx, struct sample_key *key)
{
    struct stack_overflow_event *event = overflow_event(key, 1);
    if (!event)
        return -1;
    event->user_len = stack_by_value(ctx, key->user_stack_id, event->user_ips,
                                     BPF_F_USER_STACK, &event->user_error);
    event->user_leaf_return = event->user_len ? key->user_leaf_return : 0;
    u32 klen = stack_by_value(ctx, key->kernel_stack_id, event->kernel_ips, 0,
                              &event->kernel_error);
    event->kernel_len = klen;
    klen &= 1023;  /* for the verifier: klen <= 1016 already, and kernel_ips has 1024 bytes */
    return stack_overflow.perf_submit(ctx, event,
                                      __builtin_offsetof(struct stack_overflow_event, kernel_ips) + klen);
}

#include "v8.bpf.c"
#include "unwind.bpf.c"
#include "python.bpf.c"
#include "otel_context.bpf.c"

/* Announce a process the first time it is sampled, so user space can read /proc/<tgid> while it
 * still exists.  insert() is BPF_NOEXIST: of two CPUs racing, one announces.  A tgid known as
 * another process (its pid was reused: a fork took it, and no exec cleared the entry) is announced
 * again, and the unwinder lets go of its predecessor's mappings (as at an exec) until user space
 * registers the new process: its stacks are not walked with another program's rows.  Two CPUs
 * sampling its first instants may both announce it; user space takes the second as a snapshot
 * again. */
static __always_inline void announce(void *ctx, struct sample_key *key)
{
    u64 *known = known_tgids.lookup(&key->tgid);
    if (known) {
        if (*known == key->process_start)
            return;
        *known = key->process_start;
        unwind_processes.delete(&key->tgid);
        count(COUNTER_NEW_INCARNATIONS);
    } else if (known_tgids.insert(&key->tgid, &key->process_start) != 0) {
        return;
    }
    struct new_process_event event = {};
    event.tgid = key->tgid;
    event.pid = key->pid;
    event.ktime_ns = bpf_ktime_get_ns();
    __builtin_memcpy(event.comm, key->comm, sizeof(event.comm));
    if (new_processes.perf_submit(ctx, &event, sizeof(event)) == 0)
        count(COUNTER_NEW_PROCESS_EVENTS);
    else
        count(COUNTER_PERF_OUTPUT_ERRORS);
}


int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 pid = id;

    if (pid == 0 || profiling_paused())  /* the idle task of each CPU; an interval not drawn */
        return 0;
#ifdef TARGETING
    if (!target_tgids.lookup(&tgid)) {
        count(COUNTER_NOT_TARGETED);
        return 0;
    }
#endif
    count(COUNTER_SAMPLES);

    struct sample_key key = {};
    key.tgid = tgid;
    key.pid = pid;
    key.process_start = process_start();
    key.origin = ORIGIN_CPU;
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    announce(ctx, &key);
    read_thread_context(&key);

    /* Read the slot once, before storing the stacks: the key must land in the count map whose
     * stack map holds its stack ids, even if user space flips the slot meanwhile. */
    u32 zero = 0;
    u32 *active = active_slot.lookup(&zero);
    u32 slot = active ? *active : 0;
    if (slot == 1)
        key.kernel_stack_id = stack_traces_1.get_stackid(&ctx->regs, 0);
    else
        key.kernel_stack_id = stack_traces_0.get_stackid(&ctx->regs, 0);
    count_stack_error(key.kernel_stack_id, COUNTER_KERNEL_STACK_EFAULT,
                      COUNTER_KERNEL_STACK_COLLISION, COUNTER_KERNEL_STACK_ERROR_OTHER);

    /* A process with unwind tables: the unwinder walks its stack and counts the sample (a tail
     * call: no return).  Any other, or if the walk cannot start: the kernel's frame-pointer walk. */
    start_walk(ctx, &ctx->regs, &key, slot, WALK_ON_CPU);

    if (slot == 1)
        key.user_stack_id = stack_traces_1.get_stackid(&ctx->regs, BPF_F_USER_STACK);
    else
        key.user_stack_id = stack_traces_0.get_stackid(&ctx->regs, BPF_F_USER_STACK);
    if (key.user_stack_id >= 0 || key.user_stack_id == -PROFILE_EEXIST) {
        key.user_leaf_return = user_leaf_return(&ctx->regs);
        if (key.user_leaf_return)
            count(COUNTER_LEAF_RETURN_FOUND);
    }
    count_stack_error(key.user_stack_id, COUNTER_USER_STACK_EFAULT,
                      COUNTER_USER_STACK_COLLISION, COUNTER_USER_STACK_ERROR_OTHER);

    /* A stack map is a hash table without chaining: a stack whose bucket holds another stack is
     * not stored (-EEXIST).  Rather than lose that stack for this sample (and, as the bucket stays
     * taken, for every sample with that stack until the slot is drained: a bias, not noise),
     * send the sample to user space with both stacks by value instead of counting it here.  Only
     * if that fails is it counted here, without the collided stack. */
    int flipped = slot_flipped(slot);
    if (key.kernel_stack_id == -PROFILE_EEXIST || key.user_stack_id == -PROFILE_EEXIST || flipped) {
        if (send_overflow(ctx, &key) == 0) {
            count(COUNTER_STACK_OVERFLOW_SENT);
            return 0;
        }
        count(COUNTER_STACK_OVERFLOW_ERRORS);
        if (flipped)
            return 0;  /* its stack ids are the retired slot's: lost (counted) rather than misattributed */
        if (key.user_stack_id < 0)
            key.user_leaf_return = 0;
    }

    int err = slot == 1 ? add_sample_1(&key, 1) : add_sample_0(&key, 1);
    if (err)
        count(COUNTER_MAP_FULL);
    return 0;
}

/* A process's events in the current second (memory.bpf.c's allocations walked, off_cpu.bpf.c's
 * lock and I/O waits recorded): whether one more is within `limit`. Without a lock (tracing
 * programs may not take one): two CPUs starting a second at once, or reading `events` together,
 * let a few more through, never fewer. */
struct second_budget {
    u64 second_start;  /* ktime (ns) */
    u64 events;
};

static __always_inline int within_second_budget(struct second_budget *budget, u64 now, u64 limit)
{
    if (now - budget->second_start >= 1000000000ULL) {
        budget->second_start = now;
        budget->events = 0;
    }
    __sync_fetch_and_add(&budget->events, 1);
    return budget->events <= limit;
}

#ifdef OFF_CPU
#include "off_cpu.bpf.c"
#endif

#ifdef MEMORY_PROFILING
#include "memory.bpf.c"
#endif

/* execve() replaces the image: forget the tgid so its next sample announces it again and user
 * space re-reads exe and maps (a fork+exec child is often first sampled before the exec). */
RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (known_tgids.delete(&tgid) == 0)
        count(COUNTER_EXEC_EVENTS);
    unwind_processes.delete(&tgid);  /* its mappings were the old image's */
#ifdef TARGETING
    struct new_process_event event = {};
    event.tgid = tgid;
    event.pid = bpf_get_current_pid_tgid();
    event.ktime_ns = bpf_ktime_get_ns();
    bpf_get_current_comm(&event.comm, sizeof(event.comm));
    if (exec_events.perf_submit(ctx, &event, sizeof(event)) != 0)
        count(COUNTER_PERF_OUTPUT_ERRORS);
#endif
    return 0;
}

#ifdef TARGETING
/* A new process (not a thread: its tgid is its own) of a target is a target. */
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!target_tgids.lookup(&parent))
        return 0;
    u32 child = 0;
    bpf_probe_read_kernel(&child, sizeof(child), (void *)(ctx->args[1] + TASK_TGID_OFFSET));
    if (child && child != parent) {
        u8 one = 1;
        target_tgids.update(&child, &one);
        count(COUNTER_TARGETS_FORKED);
    }
    return 0;
}
#endif
