/* Shared between bpf/profile.bpf.c (kernel side, compiled by BCC) and
 * receivers/profiling/sampler.py and bpf_counters.py (user side).
 *
 * User space does not re-declare these structs by hand: BCC turns the map key type into a ctypes
 * class (table.Key), and bpf_counters.py reads the counter indices from the `enum profile_counter`
 * below, so this header is the only place they are written down.  Keep each enumerator on its own
 * line as `NAME = value,` — bpf_counters.py parses exactly that form. */
#ifndef PYCOLLECTOR_PROFILE_H
#define PYCOLLECTOR_PROFILE_H

#ifndef TASK_COMM_LEN
#define TASK_COMM_LEN 16
#endif

/* One row of the count maps: everything that makes two samples different. */
struct sample_key {
    u32 tgid;              /* process id (user-space "pid") */
    u32 pid;               /* thread id (user-space "tid") */
    s32 kernel_stack_id;   /* id in stack_traces_N (N: this count map's slot), or -errno */
    s32 user_stack_id;     /* id in stack_traces_N, or -errno from bpf_get_stackid() */
    /* The word at the user stack pointer when it looks like a return address (it follows a
     * call instruction), else 0.  Frame-pointer unwinding skips the caller of a function that
     * has not set up a frame (gcc leaves leaf functions frameless even with
     * -fno-omit-frame-pointer; every function before its prologue ran); user space inserts this
     * address as the second frame when the unwound stack lacks it. */
    u64 user_leaf_return;
    char comm[TASK_COMM_LEN]; /* name of the sampled thread */
};

/* Sent through the new_processes perf buffer on the first sample of a tgid that is not in
 * known_tgids (and again after that process calls execve()). */
struct new_process_event {
    u32 tgid;
    u32 pid;
    u64 ktime_ns;          /* bpf_ktime_get_ns() of the sample: CLOCK_MONOTONIC */
    char comm[TASK_COMM_LEN];
};

/* Sent through the stack_overflow perf buffer instead of counting the sample in a count map when
 * a stack did not fit in the stack map (get_stackid() returned -EEXIST: its bucket holds another
 * stack).  Both stacks travel by value, so the sample keeps them.  user_ips comes first so that
 * only the used part of kernel_ips needs to be sent: the event is
 * offsetof(kernel_ips) + kernel_len bytes long (read no further). */
#define PROFILE_MAX_STACK_DEPTH 127  /* PERF_MAX_STACK_DEPTH, as in BPF_STACK_TRACE */
/* One spare slot, so that the event size the verifier sees, kernel_len & 1023, stays inside. */
#define PROFILE_STACK_SLOTS 128
struct stack_overflow_event {
    u32 tgid;
    u32 pid;
    u64 user_leaf_return;  /* as in sample_key; 0 when there is no user stack */
    s32 kernel_error;      /* 0, or the negative errno of the kernel stack (as a stack id) */
    s32 user_error;
    u32 kernel_len;        /* bytes used in kernel_ips (leaf first) */
    u32 user_len;          /* bytes used in user_ips */
    char comm[TASK_COMM_LEN];
    u64 user_ips[PROFILE_STACK_SLOTS];
    u64 kernel_ips[PROFILE_STACK_SLOTS];
};

/* Indices into the per-CPU `counters` array.  Cumulative since load; user space sums the CPUs. */
enum profile_counter {
    COUNTER_SAMPLES = 0,                 /* non-idle samples seen */
    COUNTER_MAP_FULL = 1,                /* sample dropped: count map full (update failed) */
    COUNTER_KERNEL_STACK_EFAULT = 2,     /* no kernel stack (sample taken in user mode): expected */
    COUNTER_KERNEL_STACK_COLLISION = 3,  /* -EEXIST: stack map bucket holds another stack */
    COUNTER_KERNEL_STACK_ERROR_OTHER = 4,
    COUNTER_USER_STACK_EFAULT = 5,       /* no user stack (kernel thread): expected */
    COUNTER_USER_STACK_COLLISION = 6,
    COUNTER_USER_STACK_ERROR_OTHER = 7,
    COUNTER_NEW_PROCESS_EVENTS = 8,      /* new-process events handed to the perf buffer */
    COUNTER_PERF_OUTPUT_ERRORS = 9,      /* perf_submit failed (buffer full): event lost */
    COUNTER_EXEC_EVENTS = 10,            /* execve() seen: tgid forgotten so it is re-announced */
    COUNTER_LEAF_RETURN_FOUND = 11,      /* samples with a user_leaf_return */
    COUNTER_STACK_OVERFLOW_SENT = 12,    /* collided samples sent with their stacks by value */
    COUNTER_STACK_OVERFLOW_ERRORS = 13,  /* that perf_submit failed (buffer full): the sample was
                                          * counted in the count map, without the collided stack */
    PROFILE_NR_COUNTERS = 14,
};

#endif /* PYCOLLECTOR_PROFILE_H */
