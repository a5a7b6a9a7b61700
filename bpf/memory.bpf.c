/* Memory profiling: OpenTelemetry's USDT contract (opentelemetry-ebpf-profiler,
 * design-docs/00003-memory-profiling). Pasted into profile.bpf.c when user space sets
 * -DMEMORY_PROFILING=1 (and -DLIVE_HEAP=1 for the live heap).
 *
 * A process's sampler fires otel_memory:alloc(ptr, size, weight) on a sampled allocation (weight:
 * the bytes it stands for) and otel_memory:free(ptr) when a block it sampled is freed. User space
 * (receivers/profiling/memory/) finds those probes in the process's files, attaches memory_alloc
 * and memory_free to them as uprobes of that process (kernel/uprobes.py: the probe's semaphore
 * raised while attached), and describes each probe in memory_probes, under the process and the
 * probe's address there: where its arguments are, which varies from one probe site to another.
 *
 * - memory_alloc reads the arguments, walks the allocating thread's stack as a CPU sample's is
 *   (the unwinder's kprobe copies, WALK_MEMORY: a state per thread, see unwind.bpf.c) and, at the
 *   walk's end (memory_walked), counts the allocation in the active slot's count map twice: 1
 *   under ORIGIN_ALLOC_OBJECTS and its weight under ORIGIN_ALLOC_SPACE. With LIVE_HEAP it also
 *   keeps it in live_allocs, by pointer, with its stack in live_stacks (not double-buffered: a
 *   live allocation outlives any number of reports).
 * - memory_free (LIVE_HEAP only: without it, free is not attached and the sampler does not even
 *   track its blocks) deletes the allocation from live_allocs.
 *
 * - A process gets at most MEMORY_EVENTS_PER_SECOND allocations walked a second, whatever it
 *   allocates (memory_budgets): the rest are counted (COUNTER_MEMORY_THROTTLED) and their weights
 *   and number are added to the process's next walked allocation's, so alloc_space and
 *   alloc_objects keep their totals. The live heap does not take them (a throttled block's bytes
 *   added to a kept one would stay in use as long as that one lives, whenever they were freed).
 *
 * Nothing here ever blocks or waits: a full map is counted (COUNTER_MEMORY_*, COUNTER_LIVE_*),
 * and user space reports what live_allocs holds at each report (the in-use profiles). A process
 * holds at most LIVE_ALLOCS_PER_PROCESS of live_allocs (live_counts keeps each one's count): one
 * that allocates without end, or frees what it never allocated, fills its own share, never the
 * others' room.
 *
 * Settings (cflags): MEMORY_PROBES (probes described at once), MEMORY_EVENTS_PER_SECOND (a
 * process's), LIVE_ALLOCS, LIVE_STACKS, LIVE_ALLOCS_PER_PROCESS.
 */

#ifndef MEMORY_PROBES
#define MEMORY_PROBES 4096
#endif
#ifndef LIVE_ALLOCS
#define LIVE_ALLOCS 65536
#endif
#ifndef LIVE_STACKS
#define LIVE_STACKS 16384
#endif
#ifndef LIVE_ALLOCS_PER_PROCESS
#define LIVE_ALLOCS_PER_PROCESS (LIVE_ALLOCS / 8)
#endif
#ifndef MEMORY_EVENTS_PER_SECOND
#define MEMORY_EVENTS_PER_SECOND 1000
#endif
#define MEMORY_PROCESSES 4096

/* A process's allocations walked in the current second, and what the ones past its share stood for. */
struct memory_budget {
    struct second_budget second;
    u64 owed_weight;
    u64 owed_objects;
};

BPF_HASH(memory_probes, struct memory_probe_key, struct memory_probe, MEMORY_PROBES);
BPF_HASH(memory_budgets, u32, struct memory_budget, MEMORY_PROCESSES);  /* tgid -> its budget */
/* A blank walk state, never written: what a thread's memory_walks entry starts from. */
BPF_ARRAY(memory_blank_walk, struct unwind_state, 1);
#ifdef LIVE_HEAP
BPF_HASH(live_allocs, struct live_alloc_key, struct live_alloc, LIVE_ALLOCS);
BPF_HASH(live_stacks, u64, struct user_stack, LIVE_STACKS);
BPF_HASH(live_counts, u32, s64, MEMORY_PROCESSES);  /* tgid -> its entries in live_allocs */
#endif

/* Register `index` (a pt_regs word) of `words`, without a variable offset the verifier refuses. */
static __always_inline int memory_register(u64 *words, u32 index, u64 *value)
{
#pragma unroll
    for (u32 i = 0; i < PT_REGS_WORDS; i++) {
        if (i == index) {
            *value = words[i];
            return 0;
        }
    }
    return -1;
}

/* One argument, where its descriptor says, widened to 64 bits. 0, or -1 if it cannot be read. */
static __always_inline int memory_argument(u64 *words, struct memory_arg *arg, u64 *out)
{
    u64 value = 0;
    u32 size = arg->size;
    if (arg->kind == MEMORY_ARG_REGISTER) {
        if (memory_register(words, arg->base, &value))
            return -1;
    } else if (arg->kind == MEMORY_ARG_IMMEDIATE) {
        value = arg->offset;
    } else if (arg->kind == MEMORY_ARG_MEMORY) {
        u64 base = 0, index = 0;
        if (arg->base != MEMORY_NO_REGISTER && memory_register(words, arg->base, &base))
            return -1;
        if (arg->index != MEMORY_NO_REGISTER && memory_register(words, arg->index, &index))
            return -1;
        void *address = (void *)(base + index * arg->scale + arg->offset);
        long err = -1;  /* (a constant size each: the verifier checks it against value's 8 bytes) */
        if (size == 8)
            err = read_user(&value, 8, address);
        else if (size == 4)
            err = read_user(&value, 4, address);
        else if (size == 2)
            err = read_user(&value, 2, address);
        else if (size == 1)
            err = read_user(&value, 1, address);
        if (err)
            return -1;
    } else {
        return -1;
    }
    if (size < 8) {  /* the low `size` bytes, as the compiler put them there */
        u64 mask = (1ULL << (size * 8)) - 1;
        value &= mask;
        if (arg->is_signed && (value >> (size * 8 - 1)))
            value |= ~mask;
    }
    *out = value;
    return 0;
}

/* The first `wanted` arguments of the probe the thread stopped at, if it is a `kind` probe user
 * space described for this process. 0, or -1 (counted). */
static __always_inline int memory_arguments(struct pt_regs *ctx, u32 tgid, u32 kind, u64 *args, int wanted)
{
    struct memory_probe_key probe_key = {.tgid = tgid, .ip = ctx->ip};
    struct memory_probe *probe = memory_probes.lookup(&probe_key);
    if (!probe || probe->kind != kind) {
        count(COUNTER_MEMORY_UNKNOWN_PROBE);
        return -1;
    }
    u64 words[PT_REGS_WORDS];
    if (bpf_probe_read_kernel(words, sizeof(words), ctx)) {
        count(COUNTER_MEMORY_ARG_ERRORS);
        return -1;
    }
#pragma unroll
    for (int i = 0; i < MEMORY_MAX_ARGS; i++) {
        if (i >= wanted)
            break;
        if (memory_argument(words, &probe->args[i], &args[i])) {
            count(COUNTER_MEMORY_ARG_ERRORS);
            return -1;
        }
    }
    return 0;
}

/* Whether this allocation of `tgid` is past its process's events this second: then it is counted,
 * and its weight owed to the process's next walked allocation. Otherwise the state takes what the
 * throttled ones before it owe. The counts are updated without a lock (tracing programs may not
 * take one): two threads starting a second at once, or reading `events` together, let a few more
 * through, never fewer; every owed byte is either still in the budget or in one walk's state. */
static __always_inline int memory_throttled(u32 tgid, u64 weight, u64 *owed_weight, u64 *owed_objects)
{
    struct memory_budget none = {};
    struct memory_budget *budget = memory_budgets.lookup_or_try_init(&tgid, &none);
    if (!budget) {
        count(COUNTER_MEMORY_BUDGETS_FULL);
        return 1;
    }
    if (!within_second_budget(&budget->second, bpf_ktime_get_ns(), MEMORY_EVENTS_PER_SECOND)) {
        __sync_fetch_and_add(&budget->owed_weight, weight);
        __sync_fetch_and_add(&budget->owed_objects, 1);
        count(COUNTER_MEMORY_THROTTLED);
        return 1;
    }
    *owed_weight = budget->owed_weight;
    *owed_objects = budget->owed_objects;
    if (*owed_objects) {  /* (subtracted, not zeroed: an add in between stays owed) */
        __sync_fetch_and_add(&budget->owed_weight, -*owed_weight);
        __sync_fetch_and_add(&budget->owed_objects, -*owed_objects);
    }
    return 0;
}

/* An allocation that could not be counted gives back what it took, for the next one to carry. */
static __always_inline void memory_repay(u32 tgid, u64 owed_weight, u64 owed_objects)
{
    if (!owed_objects)
        return;
    struct memory_budget *budget = memory_budgets.lookup(&tgid);
    if (budget) {
        __sync_fetch_and_add(&budget->owed_weight, owed_weight);
        __sync_fetch_and_add(&budget->owed_objects, owed_objects);
    }
}

#ifdef LIVE_HEAP
/* Keep the walked allocation in the live heap, with its stack in live_stacks under `hash`. */
static __always_inline void keep_live(struct unwind_state *state, u64 hash, int stored)
{
    struct live_alloc_key key = {.tgid = state->key.tgid, .ptr = state->memory_ptr};
    struct live_alloc live = {};
    live.process_start = state->key.process_start;
    live.weight = state->value;
    live.pid = state->key.pid;
    live.user_leaf_return = state->key.user_leaf_return;
    __builtin_memcpy(live.comm, state->key.comm, sizeof(live.comm));
    s64 none = 0;
    s64 *held = live_counts.lookup_or_try_init(&key.tgid, &none);
    if (!held) {
        count(COUNTER_LIVE_HEAP_FULL);
        return;
    }
    if (*held >= LIVE_ALLOCS_PER_PROCESS) {  /* (before its stack is stored: a flood stores none) */
        count(COUNTER_LIVE_PROCESS_FULL);
        return;
    }
    if (stored) {
        int err = live_stacks.insert(&hash, &state->stack);
        struct user_stack *there = err ? live_stacks.lookup(&hash) : NULL;
        if (!err || (there && there->check == state->stack.check))
            live.user_stack_hash = hash;
        else
            count(COUNTER_LIVE_STACKS_FULL);  /* (or another stack under its hash: kept without one) */
    }
    int err = live_allocs.insert(&key, &live);
    if (err == -PROFILE_EEXIST)  /* the pointer again, its free not seen: replaced, not counted twice */
        err = live_allocs.update(&key, &live);
    else if (!err)
        __sync_fetch_and_add(held, 1);
    if (err)
        count(COUNTER_LIVE_HEAP_FULL);
}
#endif

/* The end of a memory walk (unwind.bpf.c's finish_walk, or memory_alloc's own frame-pointer
 * walk): count the allocation under its stack, keep it in the live heap, and free the thread's
 * walk state. Its stack is never sent by value (the per-CPU event buffer is not the thread's
 * alone here): one that cannot be stored is lost, counted. */
static __always_inline void memory_walked(void *ctx, struct unwind_state *state)
{
    u32 tid = state->key.pid;
    u64 hash = 0;
    int stored = 0, counted = 0;
    /* In the slot active now, not the one active when the walk began: a walk of tail calls in a
     * preemptible uprobe can outlast the slot, which user space then drains (a CPU sample's walk
     * sends itself by value then, which this one cannot: see above). The stack goes with the count;
     * a flip between the two, once more in the new slot. */
#pragma unroll
    for (int attempt = 0; attempt < 2 && !counted; attempt++) {
        u32 zero = 0;
        u32 *active = active_slot.lookup(&zero);
        u32 slot = active ? *active : 0;
        stored = store_stack(slot, &state->stack, &hash) == 0;
        if (!stored)
            break;
        if (slot_flipped(slot))
            continue;
        state->key.user_stack_hash = hash;
        state->key.user_stack_id = STACK_HASHED;
        u64 weight = state->value + state->owed_weight, objects = 1 + state->owed_objects;
        state->key.origin = ORIGIN_ALLOC_SPACE;
        int err = slot == 1 ? add_sample_1(&state->key, weight) : add_sample_0(&state->key, weight);
        state->key.origin = ORIGIN_ALLOC_OBJECTS;
        err |= slot == 1 ? add_sample_1(&state->key, objects) : add_sample_0(&state->key, objects);
        if (err)
            count(COUNTER_MAP_FULL);
        counted = 1;
    }
    if (!counted) {
        count(COUNTER_MEMORY_LOST);
        memory_repay(state->key.tgid, state->owed_weight, state->owed_objects);
    }
#ifdef LIVE_HEAP
    keep_live(state, hash, stored);
#endif
    memory_walks.delete(&tid);
}

/* otel_memory:alloc(ptr, size, weight), attached by user space to each process's probe. */
int memory_alloc(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 tid = id;
    struct sample_key key = {};
    key.tgid = tgid;
    key.pid = tid;
    key.process_start = process_start();
    key.origin = ORIGIN_ALLOC_SPACE;
    key.kernel_stack_id = -PROFILE_EFAULT;  /* in user space: no kernel stack */
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    /* Before the arguments: a process that exec()ed keeps the old image's links, which fire at
     * the new image's probes, which user space has not described yet (an unknown probe). Its
     * announcement is what tells user space of the new image, though it may never be sampled on
     * a CPU (it sleeps between allocations). */
    announce(ctx, &key);
    u64 args[MEMORY_MAX_ARGS] = {};
    if (memory_arguments(ctx, tgid, MEMORY_PROBE_ALLOC, args, 3))
        return 0;
    count(COUNTER_MEMORY_ALLOCS);
    u64 owed_weight = 0, owed_objects = 0;
    if (memory_throttled(tgid, args[2], &owed_weight, &owed_objects))
        return 0;
    u32 zero = 0;
    struct unwind_state *blank = memory_blank_walk.lookup(&zero);
    if (!blank || memory_walks.update(&tid, blank)) {
        count(COUNTER_MEMORY_WALKS_FULL);
        memory_repay(tgid, owed_weight, owed_objects);
        return 0;
    }
    struct unwind_state *state = memory_walks.lookup(&tid);
    if (!state) {
        memory_repay(tgid, owed_weight, owed_objects);
        return 0;
    }
    state->memory_ptr = args[0];
    state->value = args[2];
    state->owed_weight = owed_weight;
    state->owed_objects = owed_objects;

    read_thread_context(&key);
    u32 *active = active_slot.lookup(&zero);
    u32 slot = active ? *active : 0;

    /* A process with unwind tables: the unwinder walks the stack and memory_walked ends the walk
     * (a tail call: no return). Any other: the kernel's frame-pointer walk. */
    start_walk(ctx, ctx, &key, slot, WALK_MEMORY);
    __builtin_memcpy(&state->key, &key, sizeof(key));
    state->slot = slot;
    long n = kernel_walked_user_stack(ctx, state->stack.ips);
    state->stack.len = n > 0 ? n / sizeof(u64) : 0;
    state->stack.complete = 0;
    state->key.user_leaf_return = n > 0 ? user_leaf_return(ctx) : 0;
    memory_walked(ctx, state);
    return 0;
}

#ifdef LIVE_HEAP
/* otel_memory:free(ptr): the allocation leaves the live heap. */
int memory_free(struct pt_regs *ctx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 args[MEMORY_MAX_ARGS] = {};
    if (memory_arguments(ctx, tgid, MEMORY_PROBE_FREE, args, 1))
        return 0;
    struct live_alloc_key key = {.tgid = tgid, .ptr = args[0]};
    if (live_allocs.delete(&key) != 0) {
        count(COUNTER_MEMORY_FREES_UNKNOWN);
        return 0;
    }
    count(COUNTER_MEMORY_FREES);
    s64 *held = live_counts.lookup(&tgid);
    if (held)
        __sync_fetch_and_add(held, -1);  /* (user space reads a count below 0, from a race, as 0) */
    return 0;
}
#endif
