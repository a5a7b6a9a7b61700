"""Debian's offcputime-bpfcc, run on a kernel without kprobes: usage as offcputime-bpfcc's.

offcputime-bpfcc attaches its program to a kprobe on finish_task_switch, where the thread coming
back is current, and takes that thread's stacks there. A kernel built without CONFIG_KPROBES
(as the bench host's) refuses the kprobe, so the tool cannot start. This runs the installed
script itself (its arguments, BPF maps, polling, symbolization and output) with two changes to
its program, the port BCC's own libbpf-tools/offcputime made: the program runs on the
sched_switch raw tracepoint (as BCC's runqlat does where it can), and, since current there is the
thread leaving, it takes the stacks and comm as the thread leaves and keeps them with the time
until the thread comes back (a thread's stacks do not change while it is off the CPU). Thread
ids come from bpf_get_current_pid_tgid() and, for the thread coming back, from task_struct at the
running kernel's offset (its BTF): the tool reads them through the kernel headers BCC compiles
with, whose task_struct (Debian's 6.1 headers on a 6.18 kernel here) puts pid elsewhere.

Run by the system Python, as the tool's own #! line does: /usr/bin/python3 THIS [ARGS].
Each change must find its place exactly once, so a different offcputime-bpfcc fails loudly
rather than being measured half changed.
"""

import re
import sys
from pathlib import Path

TOOL = "/usr/sbin/offcputime-bpfcc"

# The time a thread left the CPU, and the key (stacks, comm) it will be counted under.
START_MAP = (
    "BPF_HASH(start, u32);",
    """struct start_t {
    u64 ts;
    struct key_t key;
};
BPF_HASH(start, u32, struct start_t);""",
)

PROGRAM = (
    re.compile(r"^int oncpu\(struct pt_regs \*ctx, struct task_struct \*prev\) \{\n.*?^\}\n", re.M | re.S),
    """int oncpu(struct bpf_raw_tracepoint_args *ctx) {
    // sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    // prev is current: its ids without reading task_struct, whose layout in the kernel headers
    // BCC compiles with (Debian's 6.1 on the bench host) is not the running kernel's
    struct task_struct *prev = (struct task_struct *)ctx->args[1];
    u64 id = bpf_get_current_pid_tgid();
    u32 pid = id;
    u32 tgid = id >> 32;
    struct start_t *sp;

    // record previous thread sleep time, and its stacks: prev is current here
    if ((THREAD_FILTER) && (STATE_FILTER)) {
        struct start_t s = {};
        s.key.pid = pid;
        s.key.tgid = tgid;
        s.key.user_stack_id = USER_STACK_GET;
        s.key.kernel_stack_id = KERNEL_STACK_GET;
        bpf_get_current_comm(&s.key.name, sizeof(s.key.name));
        // after the stack walks, as the tool's kprobe notes the time of the thread leaving
        // without walking anything: else that time would count for both threads
        s.ts = bpf_ktime_get_ns();
        start.update(&pid, &s);
    }

    // get the next thread's start time: its id at the running kernel's offset (from its BTF)
    pid = 0;
    bpf_probe_read_kernel(&pid, sizeof(pid), (void *)(ctx->args[2] + TASK_PID_OFFSET));
    sp = start.lookup(&pid);
    if (sp == 0) {
        return 0;        // missed start or filtered
    }

    // calculate next thread's delta time
    u64 t_start = sp->ts;
    u64 t_end = bpf_ktime_get_ns();
    struct key_t key = sp->key;
    start.delete(&pid);
    if (t_start > t_end) {
        struct warn_event_t event = {
            .pid = pid,
            .tgid = key.tgid,
            .t_start = t_start,
            .t_end = t_end,
        };
        warn_events.perf_submit(ctx, &event, sizeof(event));
        return 0;
    }
    u64 delta = t_end - t_start;
    delta = delta / 1000;
    if ((delta < MINBLOCK_US) || (delta > MAXBLOCK_US)) {
        return 0;
    }

    counts.increment(key, delta);
    return 0;
}
""",
)

ATTACH = (
    re.compile(r"^b\.attach_kprobe\(event_re=.*?fn_name=\"oncpu\"\)\nmatched = b\.num_open_kprobes\(\)\n", re.M | re.S),
    'b.attach_raw_tracepoint(tp=b"sched_switch", fn_name=b"oncpu")\nmatched = 1\n',
)


def _replace_once(text: str, pattern, replacement: str, what: str) -> str:
    if isinstance(pattern, str):
        count = text.count(pattern)
        changed = text.replace(pattern, replacement)
    else:
        changed, count = pattern.subn(lambda _match: replacement, text)
    if count != 1:
        sys.exit(f"{TOOL}: {what} found {count} times, not once: this is not the offcputime this port knows")
    return changed


def patched_source(source: str) -> str:
    program = PROGRAM[1].replace("TASK_PID_OFFSET", str(_task_pid_offset()))
    source = _replace_once(source, *START_MAP, "the start map")
    source = _replace_once(source, PROGRAM[0], program, "the oncpu program")
    return _replace_once(source, *ATTACH, "the kprobe attachment")


def _task_pid_offset() -> int:
    """Where the running kernel keeps a thread's id in task_struct, as pycollector reads it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from receivers.profiling.kernel.btf import task_pid_offset

    return task_pid_offset()


def main() -> None:
    with open(TOOL) as tool:
        source = patched_source(tool.read())
    sys.argv[0] = TOOL
    exec(compile(source, TOOL, "exec"), {"__name__": "__main__", "__file__": TOOL})


if __name__ == "__main__":
    main()
