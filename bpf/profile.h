/* Shared between bpf/profile.bpf.c (kernel side, compiled by BCC) and
 * receivers/profiling/kernel/sampler.py and kernel/counters.py (user side).
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

#ifndef UNWIND_MAX_FRAMES
#define UNWIND_MAX_FRAMES 128  /* frames the unwinder walks (the unwind_max_frames setting) */
#endif
#ifndef UNWIND_MAX_MAPPINGS
#define UNWIND_MAX_MAPPINGS 256  /* executable mappings per process the unwinder knows */
#endif

/* A stack id meaning "stored by its hash": the user stack the unwinder walked is
 * user_stacks_N[user_stack_hash]; an off-CPU sample's kernel stack is user_stacks_N[kernel_stack_hash]. */
#define STACK_HASHED (-61)  /* -ENODATA: no stack id */

/* What a count map entry counts (sample_key.origin). */
enum sample_origin {
    ORIGIN_CPU = 0,      /* cpu-clock samples: the value is a number of samples */
    ORIGIN_OFF_CPU = 1,  /* switches back onto a CPU: the value is nanoseconds spent off it */
    /* Sampled allocations (memory.bpf.c, otel_memory:alloc): each is counted twice, under two keys
     * that differ only here: how many there were, and the bytes their weights stand for. */
    ORIGIN_ALLOC_OBJECTS = 2,
    ORIGIN_ALLOC_SPACE = 3,
    /* Waits (off_cpu.bpf.c), the value nanoseconds away as ORIGIN_OFF_CPU's: in a futex wait (a
     * user-space lock, a condition variable...), and in uninterruptible sleep (I/O). */
    ORIGIN_LOCK_WAIT = 4,
    ORIGIN_IO_WAIT = 5,
    /* The lock waits again, by who woke the waiter (off_cpu.bpf.c's wake_counts_N, struct wake_key):
     * the same nanoseconds as ORIGIN_LOCK_WAIT's, under the waiter's stacks and the waker's. */
    ORIGIN_LOCK_WAKE = 6,
};

/* One row of the count maps: everything that makes two samples different. */
struct sample_key {
    u32 tgid;              /* process id (user-space "pid") */
    u32 pid;               /* thread id (user-space "tid") */
    /* Which process had that id: its thread group leader's start_boottime (ns since boot, what
     * /proc/PID/stat's starttime counts in clock ticks), or 0 when the kernel's BTF did not say
     * where to read it.  A pid reused while its predecessor's samples are still counted is
     * another row, attributed by user space to the snapshot of its own incarnation. */
    u64 process_start;
    s32 kernel_stack_id;   /* id in stack_traces_N (N: this count map's slot), or -errno */
    s32 user_stack_id;     /* id in stack_traces_N, or -errno from bpf_get_stackid(), or
                            * STACK_HASHED */
    u64 user_stack_hash;   /* with STACK_HASHED: the key of the stack in user_stacks_N */
    /* The word at the user stack pointer when it looks like a return address (it follows a
     * call instruction), else 0.  Frame-pointer unwinding skips the caller of a function that
     * has not set up a frame (gcc leaves leaf functions frameless even with
     * -fno-omit-frame-pointer; every function before its prologue ran); user space inserts this
     * address as the second frame when the unwound stack lacks it. */
    u64 user_leaf_return;
    char comm[TASK_COMM_LEN]; /* name of the sampled thread */
    u32 origin;            /* enum sample_origin */
    u32 device;            /* ORIGIN_IO_WAIT: the device (kernel dev_t) waited on, 0 not known (off_cpu.bpf.c); else 0 */
    u64 kernel_stack_hash; /* kernel_stack_id STACK_HASHED (off-CPU): its key in user_stacks_N */
    /* The span the thread ran in, from its OpenTelemetry thread context (otel_context.bpf.c);
     * zeros when it had none.  Samples of one stack in two spans are two rows. */
    u8 trace_id[16];
    u8 span_id[8];
};

/* Who woke a thread from a lock wait (off_cpu.bpf.c's off_cpu_waking, on sched_waking, which runs
 * in the waker's context): the thread, and its stacks as it woke the waiter, stored by their hash in
 * user_stacks_N as an off-CPU wait's are. tgid and pid 0 with both ids -ENOENT: no waker was seen
 * (woken before its switch off the CPU reached the profiler); -ESTALE: its stacks were in a slot
 * retired since. A waker in another process, or the idle task (an interrupt on an idle CPU), keeps its
 * kernel stack only (user_stack_id -ESRCH): its user frames are another process's to name. */
struct waker_key {
    u32 tgid;
    u32 pid;
    char comm[TASK_COMM_LEN];
    s32 kernel_stack_id;   /* STACK_HASHED, or -errno */
    s32 user_stack_id;     /* STACK_HASHED, or -errno */
    u64 kernel_stack_hash;
    u64 user_stack_hash;
};

/* A row of wake_counts_N: a lock wait's key (origin ORIGIN_LOCK_WAKE) and its waker's. */
struct wake_key {
    struct sample_key waiter;
    struct waker_key waker;
};

/* A span's attributes as its thread context record last held them (the record's attrs-data:
 * entries of a key index, a length and that many bytes), for user space to name by the process
 * context's key map.  Kept per process and span in thread_ctx_attributes: a span id is whatever a
 * process writes in its record, so another process that copies it keeps its own entry rather than
 * overwriting the first's. */
#define THREAD_CTX_ATTRS_MAX 256
struct thread_ctx_span {
    u32 tgid;
    u8 trace_id[16];
    u8 span_id[8];
};
struct thread_ctx_attrs {
    u32 tgid;
    u16 size;              /* bytes of data used */
    u16 reserved;
    u8 data[THREAD_CTX_ATTRS_MAX];
};

/* Where a process keeps its OpenTelemetry thread context variable (OTEP 4947), as
 * receivers/profiling/otel_context/thread_context.py finds it: at the thread pointer plus
 * tp_offset (static TLS), or, when is_static is 0, at dtv[module] + offset (a dlopen()ed library). */
struct thread_ctx_location {
    s64 tp_offset;
    u64 module;
    u64 offset;
    u32 is_static;
    u32 reserved;
};

/* Sent through the new_processes perf buffer on the first sample of a tgid that is not in
 * known_tgids, or that known_tgids holds as another incarnation (process_start: a fork took a pid
 * whose last process exited), and again after that process calls execve(). */
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
#if UNWIND_MAX_FRAMES > PROFILE_STACK_SLOTS
#define PROFILE_USER_STACK_SLOTS UNWIND_MAX_FRAMES
#else
#define PROFILE_USER_STACK_SLOTS PROFILE_STACK_SLOTS
#endif
struct stack_overflow_event {
    u32 tgid;
    u32 pid;
    u64 process_start;     /* as in sample_key */
    u64 value;             /* what the sample adds to its count: 1, or off-CPU nanoseconds */
    u32 origin;            /* enum sample_origin */
    u32 device;            /* as in sample_key */
    u64 user_leaf_return;  /* as in sample_key; 0 when there is no user stack */
    s32 kernel_error;      /* 0, or the negative errno of the kernel stack (as a stack id) */
    s32 user_error;
    u32 kernel_len;        /* bytes used in kernel_ips (leaf first) */
    u32 user_len;          /* bytes used in user_ips */
    char comm[TASK_COMM_LEN];
    u8 trace_id[16];       /* the span the thread ran in, as in sample_key */
    u8 span_id[8];
    u64 user_ips[PROFILE_USER_STACK_SLOTS];
    u64 kernel_ips[PROFILE_STACK_SLOTS];
};

/* ---- Native unwinding: tables user space fills (receivers/profiling/unwind/) ---- */

/* One unwind row: from `pc` (an address in the file, before the load bias) to the next row's pc,
 * how to find the caller.  Rows of a file are sorted by pc; 12 bytes each. */
struct unwind_row {
    u32 pc;
    u8 cfa_type;     /* enum unwind_cfa_type */
    u8 rbp_type;     /* enum unwind_rbp_type */
    s16 rbp_offset;  /* RBP_AT_CFA: the caller's rbp is at CFA + rbp_offset */
    s32 cfa_offset;  /* CFA_RSP, CFA_RBP: CFA = rsp or rbp + cfa_offset; *_DEREF: see there */
};

enum unwind_cfa_type {
    CFA_UNDEFINED = 0,    /* no information here: step by frame pointer */
    CFA_RSP = 1,
    CFA_RBP = 2,
    CFA_PLT = 3,          /* CFA = rsp + 8, + 8 more when (pc & 15) >= cfa_offset (11 or 10) */
    CFA_END = 4,          /* the return address is undefined: the stack is complete */
    CFA_UNSUPPORTED = 5,  /* a rule a row cannot express: counted, then a frame-pointer step */
    /* CFA = *(rsp or rbp + (s16)cfa_offset) + (cfa_offset >> 16): a function that realigned its
     * stack keeps the caller's stack pointer in a slot (OpenSSL's assembly, glibc's start code). */
    CFA_RSP_DEREF = 6,
    CFA_RBP_DEREF = 7,
    /* A signal handler's return into the sigreturn trampoline: the interrupted registers are in
     * the ucontext at rsp, rbp at rsp + cfa_offset, then rbx, rdx, rax, rcx, rsp and rip (the
     * kernel's struct sigcontext, glibc's gregs), as the trampoline's own CFI says. */
    CFA_SIGNAL = 8,
};

enum unwind_rbp_type {
    RBP_SAME = 0,         /* the caller's rbp is this frame's */
    RBP_AT_CFA = 1,
    RBP_UNSUPPORTED = 2,  /* unknown from here on: no frame-pointer step can follow */
};

/* Where a file's rows lie in unwind_rows. */
struct unwind_file {
    u32 first_row;
    u32 row_count;
};

/* An executable mapping of a process: pc - bias is the address in the file. */
struct unwind_mapping {
    u64 start;
    u64 end;
    u64 bias;
    u32 file_id;   /* index in unwind_files (row_count 0 while its rows load); 0: no file */
    u32 kind;      /* MAPPING_NATIVE, or V8's: its JIT's code, or the builtins embedded in node */
};
#define MAPPING_NATIVE 0
#define MAPPING_V8_CODE 1
#define MAPPING_V8_BUILTINS 2  /* the interpreter among them: a JavaScript frame there interprets */
#define MAPPING_HOTSPOT_CODE 3  /* a JVM's code cache */

/* A process's executable mappings, sorted by start. */
struct unwind_process {
    u32 count;
    u32 reserved;
    struct unwind_mapping mappings[UNWIND_MAX_MAPPINGS];
};

/* A user stack the unwinder walked, or an off-CPU sample's stack, leaf first, stored in
 * user_stacks_N under its hash. */
struct user_stack {
    u64 check;     /* a second hash of the frames: a different stack under the same key differs here */
    u32 len;       /* frames used in ips */
    u32 complete;  /* 1: the walk reached the end of the stack (CFA_END, or a null return address) */
    u64 ips[UNWIND_MAX_FRAMES];
};

/* Sent through unwind_events when a sampled pc lies in no mapping the unwinder knows (a library
 * opened after the process was registered, JIT code): user space reads the process's maps again.
 * At most one a second per process. */
struct unwind_event {
    u32 tgid;
    u32 reserved;
    u64 pc;
};

/* ---- Python frames: where user space found a CPython in a process (receivers/profiling/python/) ---- */

#ifndef PYTHON_MAX_FRAMES
#define PYTHON_MAX_FRAMES 64  /* Python frames recorded a stack, innermost first */
#endif
#define PYTHON_NO_OFFSET 0xffff

/* A language runtime's frame among a user stack's frames, in place of a pc: bit 63 set, which no
 * user address has (the unwinder stops at a "return address" read from the stack that is not one,
 * see USER_ADDRESS_END), and bits 60-62 its kind, which says whose frame it is: CPython's 0 and 7
 * (PYTHON_FRAME_*), V8's 1-3 (V8_FRAME_*), HotSpot's 4-6 (HOTSPOT_FRAME_*). So the runtimes of one
 * process (a JVM that loads libpython, as Jep does) each name their own frames; the kind, not the
 * process, decides (receivers/profiling/symbols/runtime_stacks.py). */
#define RUNTIME_FRAME_TAG (1ULL << 63)
#define RUNTIME_FRAME_KIND_SHIFT 60
/* No user address is at or above it: x86-64's user space ends below 2^47, or 2^56 with 5-level
 * paging (arm64's below 2^52). */
#define USER_ADDRESS_END (1ULL << 56)

/* A Python frame: kind 0, or kind 7 for the outermost frame one call of the eval loop runs
 * (before 3.11, every frame): user space puts the frames up to such a mark where that call's
 * native frame was. Bits 47-59: the instruction (raw f_lasti before 3.11, else the index of the
 * code unit), saturating; bits 3-46: the code object's address, which is 8-byte aligned; bits
 * 0-2: the low bits of its co_firstlineno. User space reads the code object later, when the
 * address may hold another one (code objects of a module's import are freed, and the next
 * allocated there): it names a frame only from a code object whose first line agrees. */
#define PYTHON_FRAME_LAST_OF_CALL (7ULL << RUNTIME_FRAME_KIND_SHIFT)
#define PYTHON_INSTRUCTION_SHIFT 47
#define PYTHON_INSTRUCTION_MAX 0x1fffULL
#define PYTHON_ADDRESS_MASK (((1ULL << 47) - 1) & ~7ULL)
#define PYTHON_FIRST_LINE_MASK 7ULL

enum python_frame_layout {
    PYTHON_FRAME_OBJECTS = 1,      /* 2.7, 3.6-3.10: PyFrameObject, f_lasti an int */
    PYTHON_INTERPRETER_FRAMES = 2, /* 3.11+: _PyInterpreterFrame, a pointer to the instruction */
};

enum python_owner_kind {
    PYTHON_OWNER_NONE = 0,     /* every frame is its own eval loop call (before 3.11) */
    PYTHON_OWNER_IS_ENTRY = 1, /* 3.11: a bool, set on the first frame of an eval loop call */
    PYTHON_OWNER_BYTE = 2,     /* 3.12+: a char; owner_c_stack marks the entry shim frames */
};

/* Offsets are in bytes; PYTHON_NO_OFFSET where a version has no such field. */
struct python_process {
    u64 interpreters;       /* address of the pointer to the first PyInterpreterState */
    u16 interp_threads;     /* PyInterpreterState: its first PyThreadState */
    u16 thread_next;        /* PyThreadState: the next one */
    u16 thread_id;          /* PyThreadState.thread_id: the thread's pthread_self(), its fsbase */
    u16 thread_frame;       /* PyThreadState: frame, cframe (3.11-3.12) or current_frame */
    u16 cframe_frame;       /* _PyCFrame.current_frame (3.11-3.12) */
    u16 frame_code;         /* f_code, f_executable */
    u16 frame_previous;     /* f_back, previous */
    u16 frame_instruction;  /* f_lasti; prev_instr, instr_ptr */
    u16 frame_owner;        /* is_entry (3.11), owner (3.12+) */
    u16 code_instructions;  /* 3.11+: where a code object's instructions begin (co_code_adaptive) */
    u16 code_first_line;    /* co_firstlineno */
    u8 layout;              /* enum python_frame_layout */
    u8 owner_kind;          /* enum python_owner_kind */
    u8 owner_c_stack;       /* PYTHON_OWNER_BYTE: the owner value of a shim frame */
    u8 reserved[1];
};

/* ---- V8 frames: where user space found V8 in a Node.js process (receivers/profiling/v8/) ---- */

/* Every frame of V8's code keeps a frame pointer; a JavaScript frame holds its JSFunction at
 * fp + fp_function, and its context at fp + fp_context (a frame of another type holds its type
 * marker there: a small integer shifted left once, so its low bit is clear, where a context
 * pointer's is set). Offsets are V8's own (v8dbg_* symbols of the node binary), checked by user
 * space: the frame slots within the 64 bytes below the frame pointer, the fields below 4096. */
struct v8_process {
    u8 context_slot;            /* the slots, as indices of the 8 words below the frame pointer */
    u8 function_slot;
    u8 bytecode_offset_slot;    /* an interpreted frame's bytecode offset (a Smi) */
    u8 reserved_slot;
    u16 function_shared;        /* JSFunction.shared: its SharedFunctionInfo */
    u16 map_instance_type;      /* Map.instance_type (u16); a heap object's map is its first field */
    u16 first_function_type;    /* the instance types of JSFunctions */
    u16 last_function_type;
    u16 reserved;
};

/* A V8 frame among a user stack's frames, in place of its pc: bit 63 (no user address has it),
 * bits 60-62 its kind, bits 47-59 an interpreted frame's bytecode offset as the frame holds it
 * (saturating at 0x1fff), bits 0-46 the SharedFunctionInfo (a tagged pointer), which user space
 * names. A compiled frame's pc follows it (V8_FRAME_COMPILED), as user space needs it to find
 * the functions inlined there; where there was no room for it, the kind says so. */
#define V8_FRAME_INTERPRETED 1ULL
#define V8_FRAME_COMPILED 2ULL          /* the next slot holds the frame's pc */
#define V8_FRAME_COMPILED_NO_PC 3ULL
#define V8_FRAME_OFFSET_SHIFT 47
#define V8_FRAME_OFFSET_MAX 0x1fffULL
#define V8_FRAME_POINTER_MASK ((1ULL << 47) - 1)

/* ---- HotSpot frames: where user space found a JVM (receivers/profiling/hotspot/) ---- */

/* The code cache is cut into segments of 2^segment_shift bytes; a heap's segment map holds a
 * byte per segment: 0 where a block (a CodeBlob behind its HeapBlock header) starts, 0xff where
 * the segment is free, else how many segments to go back (again) to reach the block's start. */
struct hotspot_heap {
    u64 low;
    u64 high;
    u64 segmap;
};
#define HOTSPOT_HEAPS 3  /* JDK 9+: non-nmethods, profiled and non-profiled nmethods */

/* Offsets are the JVM's own (gHotSpotVMStructs), checked by user space to lie below 4096. */
struct hotspot_process {
    u64 code_low;   /* CodeCache::_low_bound, _high_bound */
    u64 code_high;
    struct hotspot_heap heaps[HOTSPOT_HEAPS];
    u16 blob_name;            /* CodeBlob::_name (const char *) */
    u16 blob_frame_size;      /* CodeBlob::_frame_size (int, in words) */
    u16 blob_frame_complete;  /* CodeBlob::_frame_complete_offset (int) */
    u16 blob_code_begin;      /* CodeBlob::_code_begin (a pointer), or _code_offset (JDK 23+) */
    u16 nmethod_method;       /* CompiledMethod::_method (Method *), nmethod::_method (JDK 23+) */
    u8 segment_shift;
    u8 heap_block_size;
    u8 code_begin_is_offset;  /* JDK 23+: an int from the blob */
    u8 frame_complete_is_short; /* JDK 25: an int16_t */
    u16 reserved;
};

/* A HotSpot frame among a user stack's frames, in place of its pc: bit 63, bits 60-62 its kind,
 * bits 0-46 the Method it runs; the next slot holds an interpreted frame's bytecode pointer or a
 * compiled frame's pc (where there was no room, the kind says so). */
#define HOTSPOT_FRAME_INTERPRETED 4ULL   /* the next slot: its bcp */
#define HOTSPOT_FRAME_COMPILED 5ULL      /* the next slot: its pc */
#define HOTSPOT_FRAME_NO_NEXT 6ULL       /* either, without its next slot */

/* ---- Memory profiling: the USDT probes of OpenTelemetry's contract (memory.bpf.c) ---- */

/* Where one argument of a probe is, as its SDT descriptor says (receivers/profiling/memory/
 * probes.py translates elf/stapsdt.py's Argument): in a register, in memory at base + index *
 * scale + offset, or the offset itself. Registers are indices of the 8-byte words of x86-64's
 * struct pt_regs. */
enum memory_arg_kind {
    MEMORY_ARG_NONE = 0,
    MEMORY_ARG_REGISTER = 1,
    MEMORY_ARG_MEMORY = 2,
    MEMORY_ARG_IMMEDIATE = 3,
};
#define MEMORY_NO_REGISTER 0xff
#define PT_REGS_WORDS 21  /* x86-64's struct pt_regs: r15 ... ss */
#define MEMORY_MAX_ARGS 3  /* alloc(ptr, size, weight); free(ptr) */
struct memory_arg {
    s64 offset;
    u8 kind;       /* enum memory_arg_kind */
    u8 size;       /* bytes read: 1, 2, 4 or 8 */
    u8 is_signed;  /* how a value shorter than 8 bytes widens */
    u8 base;       /* a pt_regs word, or MEMORY_NO_REGISTER */
    u8 index;      /* MEMORY: a pt_regs word, or MEMORY_NO_REGISTER */
    u8 scale;
    u16 reserved;
};
#define MEMORY_PROBE_ALLOC 1
#define MEMORY_PROBE_FREE 2
/* One attached probe of a process, by the address of its nop there (the uprobe's ip): the
 * arguments' places vary from one probe site to another, as the compiler chose them. */
struct memory_probe_key {
    u32 tgid;
    u32 reserved;
    u64 ip;
};
struct memory_probe {
    u32 kind;  /* MEMORY_PROBE_ALLOC or MEMORY_PROBE_FREE */
    u32 reserved;
    struct memory_arg args[MEMORY_MAX_ARGS];
};

/* Live heap: a sampled allocation not freed yet, by its process and pointer. */
struct live_alloc_key {
    u32 tgid;
    u32 reserved;
    u64 ptr;
};
struct live_alloc {
    u64 process_start;     /* as in sample_key */
    u64 weight;            /* the bytes it stands for */
    u64 user_stack_hash;   /* its stack in live_stacks; 0: none could be kept */
    u64 user_leaf_return;  /* as in sample_key (a frame-pointer walk's) */
    u32 pid;               /* the thread that allocated it */
    u32 reserved;
    char comm[TASK_COMM_LEN];
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
    COUNTER_UNWIND_SAMPLES = 14,         /* user stacks walked by the unwinder (the process has tables) */
    COUNTER_UNWIND_COMPLETE = 15,        /* of those, walks that reached the end of the stack */
    COUNTER_UNWIND_TRUNCATED = 16,       /* walks stopped by unwind_max_frames */
    COUNTER_UNWIND_TABLE_FRAMES = 17,    /* frames stepped with an unwind row */
    COUNTER_UNWIND_FP_FRAMES = 18,       /* frames stepped by frame pointer (no rows there) */
    COUNTER_UNWIND_UNKNOWN_MAPPING = 19, /* pcs in no known mapping (a re-read is requested) */
    COUNTER_UNWIND_UNSUPPORTED = 20,     /* rows with a rule they cannot express */
    COUNTER_UNWIND_READ_ERRORS = 21,     /* a return address or saved rbp could not be read */
    COUNTER_UNWIND_STACK_COLLISIONS = 22,/* a different stack held the hash: sent by value */
    COUNTER_UNWIND_STACK_MAP_FULL = 23,  /* user_stacks_N full: sent by value */
    COUNTER_UNWIND_TAIL_CALL_FAILED = 24,/* the unwinder program could not be entered: frame pointers */
    COUNTER_UNWIND_MAP_REQUESTS = 25,    /* unwind_events sent (maps to read again) */
    COUNTER_PYTHON_SAMPLES = 26,         /* samples of a process running CPython */
    COUNTER_PYTHON_NO_THREAD = 27,       /* its sampled thread has no PyThreadState (not Python's) */
    COUNTER_PYTHON_READ_ERRORS = 28,     /* interpreter memory that could not be read */
    COUNTER_PYTHON_FRAMES = 29,          /* Python frames recorded */
    COUNTER_PYTHON_TRUNCATED = 30,       /* Python stacks cut at PYTHON_MAX_FRAMES */
    COUNTER_NOT_TARGETED = 31,           /* samples of processes the targeting settings leave out */
    COUNTER_TARGETS_FORKED = 32,         /* processes forked by a target, targets in turn */
    COUNTER_OFF_CPU_SWITCHES = 33,       /* switches off a CPU recorded (off_cpu_threshold's share) */
    COUNTER_OFF_CPU_SAMPLES = 34,        /* of those, threads seen back on a CPU: off-CPU samples */
    COUNTER_OFF_CPU_WAITS_FULL = 35,     /* switches not recorded: off_cpu_waits was full */
    COUNTER_OFF_CPU_LOST = 36,           /* waits lost: their stacks could be neither stored nor sent */
    COUNTER_THREAD_CTX_SAMPLES = 37,     /* samples that ran in a span (an OpenTelemetry thread context) */
    COUNTER_THREAD_CTX_READ_ERRORS = 38, /* thread context records that could not be read */
    COUNTER_THREAD_CTX_ATTRS_CUT = 39,   /* records whose attributes passed THREAD_CTX_ATTRS_MAX bytes */
    COUNTER_UNWIND_NOT_USER_ADDRESS = 40,/* walks stopped at a "return address" beyond user space */
    COUNTER_V8_FRAMES = 41,              /* JavaScript frames recorded by their SharedFunctionInfo */
    COUNTER_V8_NOT_JS = 42,              /* frames in V8's code that are not JavaScript's (stubs, entries) */
    COUNTER_HOTSPOT_FRAMES = 43,         /* Java frames recorded by their Method */
    COUNTER_HOTSPOT_STUB_FRAMES = 44,    /* frames of the JVM's stubs and adapters stepped */
    COUNTER_HOTSPOT_NO_BLOB = 45,        /* pcs in the code cache in no CodeBlob the segment map knows */
    COUNTER_HOTSPOT_BAD_FRAME = 46,      /* frames whose layout did not hold: the walk ends there */
    COUNTER_SLOT_FLIPPED = 47,           /* samples whose slot user space retired mid-program: sent by value */
    COUNTER_HOTSPOT_LEAF_EDGES = 48,     /* Java leaves stepped in their prologue or epilogue */
    COUNTER_UNWIND_SIGNAL_FRAMES = 49,   /* signal handlers stepped to the code they interrupted */
    COUNTER_V8_BUILTIN_RETURNS = 50,     /* leaves in a builtin whose return address lay below the stack's top */
    COUNTER_NEW_INCARNATIONS = 51,       /* announcements of a known pid taken by another process */
    COUNTER_MEMORY_ALLOCS = 52,          /* otel_memory:alloc events read */
    COUNTER_MEMORY_FREES = 53,           /* otel_memory:free events that ended a live allocation */
    COUNTER_MEMORY_FREES_UNKNOWN = 54,   /* frees of no allocation the live heap holds (left out when it was full, or forged) */
    COUNTER_MEMORY_UNKNOWN_PROBE = 55,   /* events of a probe user space no longer describes (detached meanwhile) */
    COUNTER_MEMORY_ARG_ERRORS = 56,      /* events whose arguments could not be read */
    COUNTER_MEMORY_WALKS_FULL = 57,      /* allocations dropped: memory_walks full (that many threads walking at once) */
    COUNTER_MEMORY_LOST = 58,            /* allocations whose stack could not be stored (or whose slot was retired) */
    COUNTER_LIVE_HEAP_FULL = 59,         /* allocations left out of the live heap: live_allocs full */
    COUNTER_LIVE_STACKS_FULL = 60,       /* live allocations kept without their stack: live_stacks full */
    COUNTER_LIVE_PROCESS_FULL = 61,      /* allocations left out of the live heap: their process holds its share */
    COUNTER_MEMORY_THROTTLED = 62,       /* allocations past their process's events a second: not walked, their weight
                                          * carried by the process's next counted allocation */
    COUNTER_MEMORY_BUDGETS_FULL = 63,    /* allocations dropped: memory_budgets full (that many processes allocating) */
    COUNTER_LOCK_WAITS = 64,             /* switches off a CPU in a futex wait recorded as lock waits */
    COUNTER_IO_WAITS = 65,               /* switches off a CPU into uninterruptible sleep recorded as I/O waits */
    COUNTER_WAITS_THROTTLED = 66,        /* lock or I/O waits not recorded: past their process's waits a second (their
                                          * time only: throttled_time_N) */
    COUNTER_LOCK_WAKERS = 67,            /* wakers of recorded lock waits recorded (sched_waking) */
    COUNTER_LOCK_WAKERS_UNSEEN = 68,     /* lock waits that ended with no waker recorded (counted under none) */
    COUNTER_LOCK_WAKES_LOST = 69,        /* lock waits missing from lock_wake: wake_counts full, or the waiter's
                                          * stacks not stored (sent by value to lock_wait alone) */
    COUNTER_LOCK_WAKERS_EARLY = 70,      /* of the wakers recorded, those that came before their wait was stored */
    COUNTER_THREAD_STACKS = 71,          /* threads' stacks kept where they left a CPU (thread_stacks), at a new place */
    COUNTER_THREAD_STACKS_FULL = 72,     /* of those, not kept: thread_stacks was full (that many threads) */
    COUNTER_THREAD_STACKS_THROTTLED = 73,/* threads that left a CPU at a new place past their process's waits a second: not walked */
    COUNTER_THROTTLED_TIME_LOST = 74,    /* throttled waits whose time was lost: their slot taken by another thread
                                          * before they came back, or throttled_time_N full */
    PROFILE_NR_COUNTERS = 75,
};

#endif /* PYCOLLECTOR_PROFILE_H */
