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
 * Lock and I/O waits ride on the same records (LOCK_WAITS, IO_WAITS): a switch off the CPU while
 * the thread is in a futex wait (its syscall, read from the registers it entered the kernel with)
 * is a lock wait, and one into uninterruptible sleep (prev_state D, not TASK_NOLOAD) an I/O wait;
 * those are recorded whatever the threshold, up to WAITS_PER_SECOND a process a second (the rest
 * counted: a process making a million futex waits a second costs a bounded number of walks). A
 * record says which kinds it is (`kinds`), and its time away is counted under each (a wait drawn
 * for the off-CPU profile that is also a lock wait is in both profiles).
 *
 * Who woke a lock waiter (LOCK_WAITS): a second program, on sched_waking, runs in the context of
 * the thread that wakes another (try_to_wake_up: a futex_wake in pthread_mutex_unlock, a signal,
 * a timer's interrupt), where BCC's offwaketime takes it.  For a thread whose lock wait is
 * recorded, and only the first waking of that wait, it takes the waker's kernel stack and walks
 * its user stack as a CPU sample's (the unwinder: pthread_mutex_unlock's futex wake is in a libc
 * without frame pointers, whose caller a frame-pointer walk would skip), stores them in the active
 * slot's user_stacks, and leaves their hashes with the wait (`waker`).  As the waiter comes back,
 * its time away is counted once more, in wake_counts_N under its own key (origin
 * ORIGIN_LOCK_WAKE) and its waker's: the lock_wait profile itself is unchanged.  So wakers are
 * walked as many times as lock waits are recorded, within the same budget; every other wakeup on
 * the machine costs a lookup or two.  A waker often comes while the waiter is still leaving the
 * CPU (a lock handed over within microseconds), before its wait is stored: leave_cpu marks a lock
 * waiter in lock_leaving before its walk, and a waker that finds the mark but no wait leaves its
 * record in early_wakers, which the wait takes up as it comes back (the mark's time, the wait's
 * left_ns, pairs them).  A wait whose waker was still not seen (it came before the mark, or its
 * stacks went to a slot user space retired before the waiter came back) is counted under no
 * waker, so lock_wake's total is lock_wait's.
 *
 * Thread stacks (THREAD_STACKS, the threads/count profile) ride on them too: each thread's stacks
 * where it last left the CPU, kept by tid in thread_stacks until it dies (its TASK_DEAD switch),
 * for user space to count the live threads of each process by stack at every report.  A walk at
 * every switch would cost what off-CPU profiling at threshold 1 costs, so the thread is walked
 * only when it leaves the CPU from another place than its kept stack's: `place` hashes the user
 * registers it entered the kernel with (pc, stack and frame pointers, the syscall and its first
 * argument), read from its pt_regs in a few loads.  A thread parked for good, or that keeps
 * waiting at one place (a worker's queue), costs one walk, however often it switches.  Those
 * walks draw on the process's one budget (WAITS_PER_SECOND, with the lock and I/O waits'); a
 * move past it marks the kept stack `stale` (counted), and user space counts that thread under a
 * frame saying so until a later switch is walked.  A stack walked before the process had unwind
 * tables, or while a file's rows were loading, is `provisional`: walked again at the thread's next
 * switch, even at the same place, once it can be walked better.  Kernel threads (no user stack
 * pointer) are not kept.
 *
 * An I/O wait also says which device it waited on, where its syscall tells (IO_DEVICE): a thread
 * that entered the kernel for a syscall on a file descriptor (read, pread64, fsync...) waits on
 * the file system of that file, or on the block device a device file is (dd if=/dev/vda).  Its
 * dev_t is read at the switch, through the thread's file table (a few bounded reads, for recorded
 * waits only) and goes in the key (sample_key.device): user space names it (waits/devices.py).
 * Other D sleeps (a page fault on a mapped file, a path lookup, an io_uring worker) have none.
 *
 * Settings (cflags): OFF_CPU_THRESHOLD, OFF_CPU_THREADS (threads away at once that can be
 * tracked), TASK_PID_OFFSET (where task_struct keeps a thread's id, from the kernel's BTF),
 * LOCK_WAITS, IO_WAITS, WAITS_PER_SECOND, WAKE_COUNTS_SIZE (rows of each wake_counts_N),
 * THREAD_STACKS (threads whose stacks can be kept); IO_DEVICE with the offsets it reads through
 * (from BTF: TASK_FILES_OFFSET, FILES_FDT_OFFSET, FDTABLE_MAX_FDS_OFFSET, FDTABLE_FD_OFFSET,
 * FILE_INODE_OFFSET, INODE_MODE_OFFSET, INODE_RDEV_OFFSET, INODE_SB_OFFSET, SB_DEV_OFFSET).
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
#define OFF_CPU_TASK_UNINTERRUPTIBLE 0x2
#define OFF_CPU_TASK_NOLOAD 0x400  /* a D sleep that is not waiting for anything (idle kernel threads) */
#ifndef WAITS_PER_SECOND
#define WAITS_PER_SECOND 1000
#endif
#ifndef WAKE_COUNTS_SIZE
#define WAKE_COUNTS_SIZE 4096
#endif
#define OFF_CPU_ENOENT 2   /* a waker's ids: none was seen */
#define OFF_CPU_ESRCH 3    /* a waker's user stack id: another process's thread, or none (not walked) */
#define OFF_CPU_ESTALE 116 /* a waker's ids: its stacks were in a slot retired before the waiter came back */
/* How long after a lock waiter's mark a waker may find it with no wait stored yet: the waiter's
 * walk takes microseconds; a mark older than this is one whose wait was never stored. */
#define OFF_CPU_EARLY_WAKE_NS 1000000ULL
#define WAKEE_EARLY (1U << 31)  /* unwind_state.wakee: the waker's record is in early_wakers */
/* Which profiles a recorded wait counts in (off_cpu_wait.kinds). */
#define WAIT_OFF_CPU 1
#define WAIT_LOCK 2
#define WAIT_IO 4
#define WAIT_THREAD 8  /* not a wait timed on its return: the thread's stacks for thread_stacks */
#define WAITS_TIMED (WAIT_OFF_CPU | WAIT_LOCK | WAIT_IO)
#define WAITS_BUDGETED (WAIT_LOCK | WAIT_IO | WAIT_THREAD)
/* How a kept thread stack was walked (off_cpu_wait.provisional): with the process's unwind tables;
 * by frame pointer before its process had any (walked again at its next switch once it has); by
 * the unwinder while a file's rows were still loading (walked again at its next switch). */
#define WALKED_WITH_TABLES 0
#define WALKED_WITHOUT_TABLES 1
#define WALKED_ROWS_PENDING 2
/* x86-64's futex syscalls: futex(2), futex_waitv(2), futex_wait(2) (Linux 6.7). */
#define NR_FUTEX 202
#define NR_FUTEX_WAITV 449
#define NR_FUTEX_WAIT 454
/* Kernel frames kept: what bpf_get_stack() gives (PERF_MAX_STACK_DEPTH), if a stack holds that many. */
#if UNWIND_MAX_FRAMES < PROFILE_MAX_STACK_DEPTH
#define OFF_CPU_KERNEL_FRAMES UNWIND_MAX_FRAMES
#else
#define OFF_CPU_KERNEL_FRAMES PROFILE_MAX_STACK_DEPTH
#endif

/* A thread off the CPU whose switch was recorded. */
struct off_cpu_wait {
    u64 left_ns;              /* bpf_ktime_get_ns() when it left */
    u32 kinds;                /* WAIT_*: the profiles its time away goes to */
    u32 woken;                /* a lock wait: 1 once its waker is recorded (off_cpu_waking) */
    u32 stale;                /* thread_stacks: it left the CPU elsewhere since, not walked there */
    u32 provisional;          /* WALKED_*: how far its user stack is to be trusted (thread_stacks) */
    u32 device;               /* WAIT_IO: the device (kernel dev_t) its syscall's file is on, 0: not known */
    u32 padding;              /* (place is 8-aligned) */
    u64 place;                /* where it left user space (thread_place()), with THREAD_STACKS */
    struct sample_key key;    /* its hashes and ids, with the origin ORIGIN_OFF_CPU */
    struct waker_key waker;   /* who woke it (with `woken`), its stacks stored in waker_slot */
    u32 waker_slot;
    u32 reserved;
    struct user_stack kernel;
    struct user_stack user;
};

/* tid -> its wait.  Allocated as threads leave (no preallocation: a wait holds two stacks of
 * UNWIND_MAX_FRAMES, 2 KiB at the default 128).  Only a thread's own switches touch its entry:
 * it cannot be switched back in on another CPU before the switch that records it has ended. */
BPF_F_TABLE("hash", u32, struct off_cpu_wait, off_cpu_waits, OFF_CPU_THREADS, BPF_F_NO_PREALLOC);
/* Where a wait is put together before it is stored (too big for the BPF stack). */
BPF_PERCPU_ARRAY(off_cpu_scratch, struct off_cpu_wait, 1);
#if defined(LOCK_WAITS) || defined(IO_WAITS) || defined(THREAD_STACKS)
#define WAIT_BUDGETS 1
/* tgid -> its lock and I/O waits and thread walks recorded this second; least recently used first
 * out, so processes gone leave room for new ones. A process's second starts over with each report
 * too (`slot`: the active slot it counts in): so a report that has a process's throttled waits has
 * the first of its waits in that report walked, to spread their time over (throttled_time_N). */
struct wait_budget {
    struct second_budget second;
    u32 slot;
    u32 reserved;
};
BPF_TABLE("lru_hash", u32, struct wait_budget, wait_budgets, 4096);
#endif
#if defined(LOCK_WAITS) || defined(IO_WAITS)
#define THROTTLED_TIME 1
/* A lock or I/O wait past its process's budget, until its thread comes back: timed, not walked.
 * A slot per thread id modulo OFF_CPU_THREADS: an array, which every switch back can look at for
 * a few loads (a hash lookup there would cost every switch of every thread). A thread whose slot
 * another thread took before it came back loses its time, counted (throttled_time_lost). */
struct throttled_wait {
    u64 left_ns;        /* 0: none */
    u64 process_start;  /* its process's, as sample_key.process_start */
    u32 tid;
    u32 tgid;
    u32 kinds;          /* WAIT_LOCK, WAIT_IO */
    u32 reserved;
};
BPF_ARRAY(throttled_waits, struct throttled_wait, OFF_CPU_THREADS);
/* The time its throttled waits spent away, by process, double-buffered as counts_N and in step
 * with them: user space spreads it over the process's walked waits of the same interval, in
 * proportion (receivers/profiling/kernel/throttled_waits.py), so lock_wait and io_wait keep their totals
 * however many waits a second a process makes. */
struct throttled_key {
    u32 tgid;
    u32 reserved;
    u64 process_start;
};
struct throttled_time {
    u64 lock_ns;
    u64 io_ns;
};
BPF_HASH(throttled_time_0, struct throttled_key, struct throttled_time, 1024);
BPF_HASH(throttled_time_1, struct throttled_key, struct throttled_time, 1024);
#endif
#ifdef LOCK_WAITS
/* Lock waits by who woke them (ORIGIN_LOCK_WAKE), double-buffered as counts_N and in step with
 * them: a row's stacks are in the same slot's user_stacks_N. */
BPF_HASH(wake_counts_0, struct wake_key, u64, WAKE_COUNTS_SIZE);
BPF_HASH(wake_counts_1, struct wake_key, u64, WAKE_COUNTS_SIZE);
/* Where a wake's key, and a waker's stacks, are put together (too big for the BPF stack). */
BPF_PERCPU_ARRAY(wake_scratch, struct wake_key, 1);
BPF_PERCPU_ARRAY(waker_stack_scratch, struct user_stack, 1);
/* tid -> a lock waiter leaving the CPU (see the top of this file), until it comes back. */
struct lock_leaving {
    u64 left_ns;  /* leave_cpu's `now`: its wait's left_ns */
    u32 tgid;
    u32 reserved;
};
BPF_TABLE("lru_hash", u32, struct lock_leaving, lock_leaving, OFF_CPU_THREADS);
/* tid -> who woke it before its wait was stored, for the wait of that left_ns. */
struct early_waker {
    u64 left_ns;
    struct waker_key waker;
    u32 slot;
    u32 reserved;
};
BPF_TABLE("lru_hash", u32, struct early_waker, early_wakers, 4096);
#endif
#ifdef THREAD_STACKS
/* tid -> its stacks where it last left the CPU (where it sleeps now, if it sleeps), as a wait
 * keeps them; no preallocation: 2 KiB an entry at 128 frames. Deleted at the thread's last
 * switch; user space deletes those of threads gone otherwise (an exec's). */
BPF_F_TABLE("hash", u32, struct off_cpu_wait, thread_stacks, THREAD_STACKS, BPF_F_NO_PREALLOC);
#endif

/* Store the finished wait under the thread's id, until it returns; and, with WAIT_THREAD, as the
 * thread's stacks. */
static __always_inline void keep_wait(struct off_cpu_wait *wait)
{
    u32 tid = wait->key.pid;
#ifdef THREAD_STACKS
    if (wait->kinds & WAIT_THREAD) {
        wait->stale = 0;
        if (thread_stacks.update(&tid, wait) == 0)
            count(COUNTER_THREAD_STACKS);
        else
            count(COUNTER_THREAD_STACKS_FULL);
    }
    if (!(wait->kinds & WAITS_TIMED))
        return;
#endif
    if (off_cpu_waits.update(&tid, wait) == 0) {
        count(COUNTER_OFF_CPU_SWITCHES);
        return;
    }
    count(COUNTER_OFF_CPU_WAITS_FULL);
#ifdef LOCK_WAITS
    lock_leaving.delete(&tid);
#endif
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
    wait->provisional = state->rows_pending ? WALKED_ROWS_PENDING : WALKED_WITH_TABLES;
    bpf_probe_read_kernel(&wait->user, sizeof(wait->user), &state->stack);  /* too big for an inline copy */
    keep_wait(wait);
}

#ifdef LOCK_WAITS
/* Whether the thread leaving the CPU entered the kernel for a futex wait. */
static __always_inline int in_futex_wait(void)
{
    struct task_struct *task = bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    u64 nr = 0;
    if (!regs || bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax))
        return 0;
    return nr == NR_FUTEX || nr == NR_FUTEX_WAITV || nr == NR_FUTEX_WAIT;
}
#endif

#ifdef IO_DEVICE
/* x86-64 syscalls whose first argument is the file descriptor of the file they read, write or
 * sync (splice and copy_file_range: the one read from). */
static __always_inline int takes_file_first(u64 nr)
{
    switch (nr) {
    case 0: case 1: case 17: case 18: case 19: case 20:  /* read write pread64 pwrite64 readv writev */
    case 74: case 75: case 77: case 78: case 187:        /* fsync fdatasync ftruncate getdents readahead */
    case 217: case 221: case 275: case 277: case 285:    /* getdents64 fadvise64 splice sync_file_range fallocate */
    case 295: case 296: case 306: case 326: case 327: case 328:  /* preadv pwritev syncfs copy_file_range preadv2 pwritev2 */
        return 1;
    }
    return 0;
}

#define IO_ENOSYS 38
#define IO_USER_CS 0x33  /* __USER_CS: a 64-bit task (a 32-bit one's syscalls are numbered otherwise) */
#define IO_S_IFMT 0170000
#define IO_S_IFBLK 0060000

/* The device the leaving thread's syscall waits on: the dev_t of the file system its file
 * descriptor's file is on, or for a block device file the device itself; 0 when it is in no
 * such syscall or a read fails.  The registers it entered the kernel with say which: a syscall's
 * entry sets ax to -ENOSYS until it returns (an exception's keeps the user's ax, and its
 * orig_ax is an error code, not a syscall number); di is the first argument. */
static __always_inline u32 io_device(void)
{
    struct task_struct *task = bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    u64 nr = 0, ax = 0, cs = 0, fd = 0;
    if (!regs || bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax) || bpf_probe_read_kernel(&ax, sizeof(ax), &regs->ax) ||
        bpf_probe_read_kernel(&cs, sizeof(cs), &regs->cs) || bpf_probe_read_kernel(&fd, sizeof(fd), &regs->di))
        return 0;
    if (ax != (u64)-IO_ENOSYS || cs != IO_USER_CS || !takes_file_first(nr))
        return 0;
    void *files = NULL, *fdt = NULL, *fds = NULL, *file = NULL, *inode = NULL, *sb = NULL;
    u32 max_fds = 0, dev = 0;
    u16 mode = 0;
    if (bpf_probe_read_kernel(&files, sizeof(files), (void *)task + TASK_FILES_OFFSET) || !files ||
        bpf_probe_read_kernel(&fdt, sizeof(fdt), files + FILES_FDT_OFFSET) || !fdt ||
        bpf_probe_read_kernel(&max_fds, sizeof(max_fds), fdt + FDTABLE_MAX_FDS_OFFSET) || fd >= max_fds ||
        bpf_probe_read_kernel(&fds, sizeof(fds), fdt + FDTABLE_FD_OFFSET) || !fds ||
        bpf_probe_read_kernel(&file, sizeof(file), fds + fd * sizeof(void *)) || !file ||
        bpf_probe_read_kernel(&inode, sizeof(inode), file + FILE_INODE_OFFSET) || !inode ||
        bpf_probe_read_kernel(&mode, sizeof(mode), inode + INODE_MODE_OFFSET))
        return 0;
    if ((mode & IO_S_IFMT) == IO_S_IFBLK)
        return bpf_probe_read_kernel(&dev, sizeof(dev), inode + INODE_RDEV_OFFSET) ? 0 : dev;
    if (bpf_probe_read_kernel(&sb, sizeof(sb), inode + INODE_SB_OFFSET) || !sb ||
        bpf_probe_read_kernel(&dev, sizeof(dev), sb + SB_DEV_OFFSET))
        return 0;
    return dev;
}
#endif

/* The kinds of wait a switch off the CPU is (WAIT_*), before the process's budget: `state` is
 * the leaving thread's prev_state, `preempted` whether it was preempted (then it waits for a CPU,
 * not for anything: only the off-CPU profile's draw takes it). */
static __always_inline u32 wait_kinds(u64 state, u64 preempted)
{
    u32 kinds = 0;
    if (OFF_CPU_THRESHOLD && bpf_get_prandom_u32() <= OFF_CPU_THRESHOLD)
        kinds |= WAIT_OFF_CPU;
    if (preempted || state == 0)  /* TASK_RUNNING */
        return kinds;
#ifdef LOCK_WAITS
    if (in_futex_wait())
        kinds |= WAIT_LOCK;
#endif
#ifdef IO_WAITS
    if ((state & OFF_CPU_TASK_UNINTERRUPTIBLE) && !(state & OFF_CPU_TASK_NOLOAD))
        kinds |= WAIT_IO;
#endif
    return kinds;
}

#ifdef WAIT_BUDGETS
/* Whether the process has lock and I/O waits (and thread walks) left this second. */
static __always_inline int wait_allowed(u32 tgid, u64 now)
{
    struct wait_budget none = {};
    struct wait_budget *budget = wait_budgets.lookup_or_try_init(&tgid, &none);
    if (!budget)
        return 0;
    u32 zero = 0;
    u32 *active = active_slot.lookup(&zero);
    u32 slot = active ? *active : 0;
    if (budget->slot != slot) {  /* a report began since its last wait: its second starts over */
        budget->slot = slot;
        budget->second.second_start = now;
        budget->second.events = 0;
    }
    return within_second_budget(&budget->second, now, WAITS_PER_SECOND);
}
#endif

#ifdef THROTTLED_TIME
/* The thread `tid` leaving the CPU at `now` in a lock or I/O wait (`kinds`) past its process's
 * budget: timed from here (add_throttled_time, as it comes back). */
static __always_inline void time_throttled_wait(u32 tgid, u32 tid, u32 kinds, u64 now)
{
    u32 index = tid % OFF_CPU_THREADS;
    struct throttled_wait *slot = throttled_waits.lookup(&index);
    if (!slot)
        return;
    if (slot->left_ns && slot->tid != tid)
        count(COUNTER_THROTTLED_TIME_LOST);  /* another thread's, away still: its time goes */
    slot->left_ns = now;
    slot->process_start = process_start();
    slot->tid = tid;
    slot->tgid = tgid;
    slot->kinds = kinds;
}

/* The thread `tid` back on a CPU at `now`: if it was away in a throttled wait, its time away goes
 * to its process's throttled time in the active slot. */
static __always_inline void add_throttled_time(u32 tid, u64 now)
{
    u32 index = tid % OFF_CPU_THREADS;
    struct throttled_wait *slot = throttled_waits.lookup(&index);
    if (!slot || slot->tid != tid || !slot->left_ns)
        return;
    u64 away = now - slot->left_ns;
    struct throttled_key key = {.tgid = slot->tgid, .process_start = slot->process_start};
    u32 kinds = slot->kinds;
    slot->left_ns = 0;
    u32 zero = 0;
    u32 *active = active_slot.lookup(&zero);
    struct throttled_time none = {};
    struct throttled_time *time = active && *active == 1 ? throttled_time_1.lookup_or_try_init(&key, &none)
                                                         : throttled_time_0.lookup_or_try_init(&key, &none);
    if (!time) {
        count(COUNTER_THROTTLED_TIME_LOST);  /* (that many processes throttled in one interval) */
        return;
    }
    if (kinds & WAIT_LOCK)
        __sync_fetch_and_add(&time->lock_ns, away);
    if (kinds & WAIT_IO)
        __sync_fetch_and_add(&time->io_ns, away);
}
#endif

#ifdef THREAD_STACKS
/* Where the leaving thread left user space: a hash of the user registers it entered the kernel
 * with (pc, stack and frame pointers; the syscall and its first argument: a futex's address).
 * Two switches at one place have one stack, but for a thread that came to the same instruction
 * with the same stack and frame pointers by another path (not walked again: README). 0: a
 * kernel thread (no user stack pointer), whose threads are not counted. */
static __always_inline u64 thread_place(void)
{
    struct task_struct *task = bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    u64 ip = 0, sp = 0, bp = 0, nr = 0, arg = 0;
    if (!regs || bpf_probe_read_kernel(&sp, sizeof(sp), &regs->sp) || sp == 0)
        return 0;  /* a kernel thread has no user stack */
    bpf_probe_read_kernel(&ip, sizeof(ip), &regs->ip);
    bpf_probe_read_kernel(&bp, sizeof(bp), &regs->bp);
    bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax);
    bpf_probe_read_kernel(&arg, sizeof(arg), &regs->di);
    u64 place = ip * 0x9E3779B97F4A7C15ULL;
    place = (place ^ sp) * 0xC2B2AE3D27D4EB4FULL;
    place = (place ^ bp) * 0x165667B19E3779F9ULL;
    place = (place ^ nr) * 0x27D4EB2F165667C5ULL;
    place = (place ^ arg) * 0x9E3779B97F4A7C15ULL;
    return place | 1;  /* never 0 */
}

/* Whether the leaving thread `tid` of `tgid`, at `place`, needs a walk for thread_stacks: none
 * kept, kept from another place, or kept before its stack could be walked as well as now (its
 * process had no unwind tables then and has now, or a file's rows were loading). `*kept`: its
 * entry, if any. */
static __always_inline int thread_walk_wanted(u32 tgid, u32 tid, u64 place, struct off_cpu_wait **kept)
{
    struct off_cpu_wait *entry = thread_stacks.lookup(&tid);
    *kept = entry;
    if (!entry || entry->place != place || entry->provisional == WALKED_ROWS_PENDING)
        return 1;
    return entry->provisional == WALKED_WITHOUT_TABLES && unwind_processes.lookup(&tgid) != NULL;
}
#endif

/* The thread leaving the CPU (current) at `now`: note its stacks and the time, for a share of
 * switches and for every lock or I/O wait (and, with THREAD_STACKS, as the thread's stacks when
 * it leaves from another place than last time). */
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
    if (ctx->args[3] & OFF_CPU_TASK_DEAD) {
#ifdef THREAD_STACKS
        thread_stacks.delete(&pid);
#endif
        return;
    }
    u32 kinds = wait_kinds(ctx->args[3], ctx->args[0]);
#ifdef THREAD_STACKS
    u64 place = thread_place();
    struct off_cpu_wait *kept = NULL;
    if (place && thread_walk_wanted(tgid, pid, place, &kept))
        kinds |= WAIT_THREAD;
#endif
#ifdef WAIT_BUDGETS
    if ((kinds & WAITS_BUDGETED) && !wait_allowed(tgid, now)) {
        if (kinds & (WAIT_LOCK | WAIT_IO)) {
            count(COUNTER_WAITS_THROTTLED);
#ifdef THROTTLED_TIME
            time_throttled_wait(tgid, pid, kinds & (WAIT_LOCK | WAIT_IO), now);
#endif
        }
#ifdef THREAD_STACKS
        if (kinds & WAIT_THREAD) {
            count(COUNTER_THREAD_STACKS_THROTTLED);
            if (kept)
                kept->stale = 1;  /* (its place stays the old one: the next switch tries again) */
        }
#endif
        kinds &= WAIT_OFF_CPU;
    }
#endif
    if (!kinds)
        return;
    if (kinds & WAIT_LOCK) {
        count(COUNTER_LOCK_WAITS);
#ifdef LOCK_WAITS
        struct lock_leaving mark = {.left_ns = now, .tgid = tgid};
        lock_leaving.update(&pid, &mark);
#endif
    }
    if (kinds & WAIT_IO)
        count(COUNTER_IO_WAITS);
    u32 zero = 0;
    struct off_cpu_wait *wait = off_cpu_scratch.lookup(&zero);
    if (!wait)
        return;
    wait->left_ns = now;
    wait->kinds = kinds;
    wait->woken = 0;
    wait->device = 0;
#ifdef IO_DEVICE
    if (kinds & WAIT_IO)
        wait->device = io_device();
#endif
#ifdef THREAD_STACKS
    wait->place = place;
#endif
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
#ifdef LOCK_WAITS
    struct unwind_state *walk = unwind_state.lookup(&zero);
    if (walk)
        walk->wakee = 0;  /* (the wait's own stack, not a waker's) */
#endif
    start_walk(ctx, NULL, &wait->key, 0, WALK_OFF_CPU);
    wait->provisional = WALKED_WITHOUT_TABLES;
    n = kernel_walked_user_stack(ctx, wait->user.ips);
    wait->user.len = n > 0 ? n / sizeof(u64) : 0;
    wait->user.complete = 0;
    if (n > 0) {
        wait->key.user_stack_id = STACK_HASHED;
        wait->key.user_leaf_return = user_leaf_return(NULL);
    } else {
        wait->key.user_stack_id = n < 0 ? n : -PROFILE_EFAULT;  /* (a kernel thread has no user stack, nor one cut at its leaf) */
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

/* Count `away` under the wait's stacks as `origin`: in the slot's count map, or by value when
 * its stacks could not be stored there (`failed`). */
static __always_inline void count_wait(struct bpf_raw_tracepoint_args *ctx, struct off_cpu_wait *wait, u32 origin, u32 slot, int failed,
                                       u64 away)
{
    wait->key.origin = origin;
    wait->key.device = origin == ORIGIN_IO_WAIT ? wait->device : 0;  /* (the I/O wait's alone: the others' rows stay one) */
    if (!failed) {
        int err = slot == 1 ? add_sample_1(&wait->key, away) : add_sample_0(&wait->key, away);
        if (err)
            count(COUNTER_MAP_FULL);
    } else if (send_wait_by_value(ctx, wait, away) == 0) {
        count(COUNTER_STACK_OVERFLOW_SENT);
    } else {
        count(COUNTER_OFF_CPU_LOST);
    }
}

#ifdef LOCK_WAITS
/* Add `away` to wake_counts_N[key] (as add_sample_N: written out once per map). */
static __always_inline int add_wake_0(struct wake_key *key, u64 away)
{
    u64 *value = wake_counts_0.lookup(key);
    if (value) {
        __sync_fetch_and_add(value, away);
        return 0;
    }
    int err = wake_counts_0.insert(key, &away);
    if (err == -PROFILE_EEXIST) {
        value = wake_counts_0.lookup(key);
        if (value) {
            __sync_fetch_and_add(value, away);
            return 0;
        }
    }
    return err;
}

static __always_inline int add_wake_1(struct wake_key *key, u64 away)
{
    u64 *value = wake_counts_1.lookup(key);
    if (value) {
        __sync_fetch_and_add(value, away);
        return 0;
    }
    int err = wake_counts_1.insert(key, &away);
    if (err == -PROFILE_EEXIST) {
        value = wake_counts_1.lookup(key);
        if (value) {
            __sync_fetch_and_add(value, away);
            return 0;
        }
    }
    return err;
}

/* A lock wait's time away under its waiter's stacks and its waker's, in the slot's wake_counts
 * (the waiter's stacks are stored there, unless `failed`: then only lock_wait has it, by value). */
static __always_inline void count_wake(struct off_cpu_wait *wait, u32 slot, int failed, u64 away)
{
    u32 tid = wait->key.pid;
    lock_leaving.delete(&tid);
    struct early_waker *early = wait->woken ? NULL : early_wakers.lookup(&tid);
    if (early && early->left_ns == wait->left_ns) {  /* woken before its wait was stored */
        __builtin_memcpy(&wait->waker, &early->waker, sizeof(wait->waker));
        wait->waker_slot = early->slot;
        wait->woken = 1;
    }
    if (early)
        early_wakers.delete(&tid);
    u32 zero = 0;
    struct wake_key *key = wake_scratch.lookup(&zero);
    if (!key || failed) {
        count(COUNTER_LOCK_WAKES_LOST);
        return;
    }
    __builtin_memcpy(&key->waiter, &wait->key, sizeof(key->waiter));
    key->waiter.origin = ORIGIN_LOCK_WAKE;
    if (wait->woken && wait->waker_slot == slot) {
        __builtin_memcpy(&key->waker, &wait->waker, sizeof(key->waker));
    } else {
        __builtin_memset(&key->waker, 0, sizeof(key->waker));
        key->waker.kernel_stack_id = key->waker.user_stack_id = wait->woken ? -OFF_CPU_ESTALE : -OFF_CPU_ENOENT;
        count(COUNTER_LOCK_WAKERS_UNSEEN);
    }
    int err = slot == 1 ? add_wake_1(key, away) : add_wake_0(key, away);
    if (err)
        count(COUNTER_LOCK_WAKES_LOST);
}
#endif

/* The thread the CPU switches to (`next`) at `now`: if its leaving was recorded, count the time away. */
static __always_inline void return_to_cpu(struct bpf_raw_tracepoint_args *ctx, u64 now)
{
    u32 tid = 0;
    bpf_probe_read_kernel(&tid, sizeof(tid), (void *)(ctx->args[2] + TASK_PID_OFFSET));
    if (tid == 0)
        return;
#ifdef THROTTLED_TIME
    add_throttled_time(tid, now);  /* (a throttled lock wait may be recorded as an off-CPU wait all the same) */
#endif
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
    failed |= slot_flipped(slot);
    /* Its time away, under each kind it is (the keys differ only in their origin). */
    if (wait->kinds & WAIT_OFF_CPU)
        count_wait(ctx, wait, ORIGIN_OFF_CPU, slot, failed, away);
    if (wait->kinds & WAIT_LOCK)
        count_wait(ctx, wait, ORIGIN_LOCK_WAIT, slot, failed, away);
    if (wait->kinds & WAIT_IO)
        count_wait(ctx, wait, ORIGIN_IO_WAIT, slot, failed, away);
#ifdef LOCK_WAITS
    if (wait->kinds & WAIT_LOCK)
        count_wake(wait, slot, failed, away);
#endif
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

#ifdef LOCK_WAITS
/* The end of a waker's walk (unwind.bpf.c's finish_walk): its user stack, stored, is the waker's
 * of state->wakee's wait. */
static __always_inline void store_waker_stack(struct unwind_state *state, struct waker_key *waker)
{
    u64 hash = 0;
    if (store_stack(state->slot, &state->stack, &hash)) {  /* (counted there) */
        waker->user_stack_id = -PROFILE_EEXIST;
        return;
    }
    waker->user_stack_hash = hash;
    waker->user_stack_id = STACK_HASHED;
}

static __always_inline void keep_walked_waker(struct unwind_state *state)
{
    u32 tid = state->wakee & ~WAKEE_EARLY;
    if (state->wakee & WAKEE_EARLY) {
        struct early_waker *early = early_wakers.lookup(&tid);
        if (early)
            store_waker_stack(state, &early->waker);
        return;
    }
    struct off_cpu_wait *wait = off_cpu_waits.lookup(&tid);
    if (wait)
        store_waker_stack(state, &wait->waker);
}

/* sched_waking(struct task_struct *p), attached by user space: the current thread wakes p (see the
 * top of this file).  It runs with interrupts off (try_to_wake_up holds p's pi_lock), so its walk
 * has the CPU's unwind_state to itself as leave_cpu's has; a thread waking itself, the one case
 * that runs with them on, returns first. */
int off_cpu_waking(struct bpf_raw_tracepoint_args *ctx)
{
    u32 tid = 0;
    bpf_probe_read_kernel(&tid, sizeof(tid), (void *)(ctx->args[0] + TASK_PID_OFFSET));
    u64 id = bpf_get_current_pid_tgid();
    if (tid == 0 || tid == (u32)id)
        return 0;
    struct waker_key *waker;
    u32 wakee_tgid, early = 0;
    u32 zero = 0;
    u32 *active = active_slot.lookup(&zero);
    u32 slot = active ? *active : 0;
    struct off_cpu_wait *wait = off_cpu_waits.lookup(&tid);
    if (wait) {
        if (!(wait->kinds & WAIT_LOCK) || wait->woken)
            return 0;
        wait->woken = 1;
        wait->waker_slot = slot;
        waker = &wait->waker;
        wakee_tgid = wait->key.tgid;
    } else {  /* a lock waiter still leaving the CPU, its wait not stored yet? */
        struct lock_leaving *mark = lock_leaving.lookup(&tid);
        if (!mark || bpf_ktime_get_ns() - mark->left_ns > OFF_CPU_EARLY_WAKE_NS)
            return 0;
        struct early_waker fresh = {.left_ns = mark->left_ns, .slot = slot};
        wakee_tgid = mark->tgid;
        if (early_wakers.update(&tid, &fresh))
            return 0;
        struct early_waker *record = early_wakers.lookup(&tid);
        if (!record)
            return 0;
        waker = &record->waker;
        early = WAKEE_EARLY;
        count(COUNTER_LOCK_WAKERS_EARLY);
    }
    count(COUNTER_LOCK_WAKERS);
    __builtin_memset(waker, 0, sizeof(*waker));  /* (a row's key: no stale hash beside an error) */
    waker->tgid = id >> 32;
    waker->pid = id;
    bpf_get_current_comm(&waker->comm, sizeof(waker->comm));
    waker->user_stack_id = -OFF_CPU_ESRCH;

    struct user_stack *stack = waker_stack_scratch.lookup(&zero);
    if (!stack) {
        waker->kernel_stack_id = -OFF_CPU_ENOENT;
        return 0;
    }
    long n = bpf_get_stack(ctx, stack->ips, OFF_CPU_KERNEL_FRAMES * sizeof(u64), 0);
    stack->len = n > 0 ? n / sizeof(u64) : 0;
    stack->complete = 1;
    if (n > 0)
        waker->kernel_stack_id = store_stack(slot, stack, &waker->kernel_stack_hash) ? -PROFILE_EEXIST : STACK_HASHED;
    else
        waker->kernel_stack_id = n < 0 ? n : -PROFILE_EFAULT;
    /* A thread of another process (a process-shared lock), or none (an interrupt on an idle CPU):
     * its user frames would be another process's to name. */
    if (waker->tgid != wakee_tgid || waker->pid == 0)
        return 0;

    /* Its user stack: walked by the unwinder, keep_walked_waker storing it (a tail call: no
     * return); else the kernel's frame-pointer walk. */
    struct unwind_state *walk = unwind_state.lookup(&zero);
    if (walk)
        walk->wakee = tid | early;
    struct sample_key key = {};
    key.tgid = waker->tgid;
    key.pid = waker->pid;
    key.origin = ORIGIN_LOCK_WAKE;
    start_walk(ctx, NULL, &key, slot, WALK_OFF_CPU);
    n = kernel_walked_user_stack(ctx, stack->ips);
    stack->len = n > 0 ? n / sizeof(u64) : 0;
    stack->complete = 0;
    if (n > 0)
        waker->user_stack_id = store_stack(slot, stack, &waker->user_stack_hash) ? -PROFILE_EEXIST : STACK_HASHED;
    else
        waker->user_stack_id = n < 0 ? n : -PROFILE_EFAULT;
    return 0;
}
#endif
