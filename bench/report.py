"""bench/RESULTS.md: the machine and conditions of the run, then one table of every figure
against its peer, then how each figure was measured."""

from __future__ import annotations

import datetime
import os
import platform
import textwrap
from pathlib import Path

from bench import peers, procfs
from bench.figures import Row
from bench.settings import Settings

WIDTH = 100
HEADER = ["Section", "Figure", "pycollector", "Peer", "Peer's figure", "Ratio (pycollector / peer)", "Target"]

METHOD = """\
- **Rounds.** Each round runs the workload with no profiler, then under pycollector, perf and
  profile-bpfcc, in an order rotated by one each round; every profiler samples all CPUs at {hz} Hz
  with user and kernel stacks. A cell is the median over the rounds with [min–max]; a ratio is
  pycollector's figure over the peer's *in the same round*, then median [min–max].
- **Workload.** One copy of `shared/workloads/known_split.c` per CPU (`gcc -O2
  -fno-omit-frame-pointer`), each running {workload_seconds:g} s and printing its iterations. A
  profiler's window starts {settle_seconds:g} s after its first sample, the workload running
  meanwhile too (steady state): by then pycollector has made its first report, which symbolizes
  every binary on the host with cold caches; that CPU is the start-up row "CPU from first sample
  to the steady-state window". Iterations per CPU second divide by the CPU time the copies got
  (wait4), which removes CPU the profiler's own process took and keeps what each sample costs the
  workload.
- **pycollector** is the installed `pycollector` command with the profiling receiver
  (`reporter_interval: {reporter_interval_s:g}s`) exporting OTLP/gRPC (gzip, its default) to a
  sink in the bench, so building, encoding and sending reports is in the window. **perf** is `perf
  record -F {hz} -a -g`; **profile-bpfcc** is BCC's tool, `-F {hz}`.
- **Agent cost.** CPU: time on CPU of every thread of the profiler's process tree
  (/proc/PID/task/TID/schedstat, ns resolution) over the window, per second of window. Peak RSS:
  VmHWM at the end of the window. BPF: `kernel.bpf_stats_enabled=1` for the run (restored after),
  `bpftool prog show` run_time_ns / run_cnt of the perf_event program the profiler holds, over the
  window. perf has no BPF program.
- **Start-up.** From launch to the first sample: for the BPF tools, the first run of their program
  (run_cnt > 0); for perf, its ring buffers mapped on every CPU. CPU is the process tree's over
  the same span (BCC tools compile their C program with clang in-process). pycollector keeps its
  compiled BPF program (`bpf_cache_dir`): the rounds' agents share the cache the row cache's
  warm-up filled, so theirs is a restart's start-up; "first start" rounds of their own start it
  with an empty cache (it compiles, in a child process whose CPU is counted) against
  profile-bpfcc in the same round.
- **Truth** and **Sizes** come from rounds of their own in which pycollector and perf profile the
  same {side_by_side_seconds:g} s of workload at the same time and are stopped together.
  spin_heavy's share: leaf frames of the workload processes' samples, from the OTLP pycollector
  exported and from `perf script` of perf.data. Named frames: samples of any process (idle and
  the two profilers excluded) having user frames, counting those whose every user frame has a
  symbol. Sizes: the bytes of pycollector's OTLP requests (and each request gzipped at level 6)
  per sampled tick (sum of sample counts), against perf.data's size (and gzipped) per perf sample
  record.
- **Row cache.** Before the rounds, pycollector runs on both builds of the workload until it has
  built the unwind rows of every file the host maps ({warm_up_seconds:.0f} s this run), into the
  cache every round then starts from, as a restarted agent does; the cold build is measured
  under Unwinding.
- **Unwinding.** Rounds like the ones above (no profiler, pycollector, `perf record -F {hz} -a
  --call-graph dwarf`, profile-bpfcc, rotated) on known_split built `gcc -O2
  -fomit-frame-pointer`, which pycollector walks with the rows of each file's .eh_frame; perf's
  DWARF mode copies 8 KiB of each sampled stack and unwinds it afterwards (`perf report`), which
  is not in its figure. profile-bpfcc walks frame pointers (on this build it stops after a frame
  or two): the BPF target holds pycollector's time per sample against it. Start-up: with the
  copies already running, pycollector starts with an empty row cache (cold), then again with the
  cache that start filled (warm); it reports every 0.2 s, and the figure is the time from its
  first sample to the end of the first report in which 95% of the copies' samples reach their
  entry (`_start`, `__libc_start_call_main`). Files and rows: the unwind tables pycollector
  loaded for the processes it sampled on this host (its `pycollector_profiling_unwind_tables`
  metric, at the end of the warm start-up), 12 bytes of kernel memory a row.
- **Python frames.** One `known_split.py` per CPU, under different CPythons (pyenv's newest, then
  Debian's python3), runs through each round; pycollector (Python frames on, its default) and
  then `py-spy record --rate {hz} --pid PID` on each of them, rotated, each settling
  {settle_seconds:g} s before a {workload_seconds:g} s window. pycollector's total is its own CPU
  and its BPF program's run time (bpf_stats), which the kernel charges to the sampled processes;
  py-spy's is the CPU of all its processes (it reads the interpreters' memory from its own).
- **Java and JavaScript frames.** One copy of a workload per CPU, through each round, in rotated
  order: known_split.c (frame pointers), KnownSplit under plain java (JDK 17: no frame pointers,
  no perf map) and known_split.js under plain node; pycollector settles {settle_seconds:g} s,
  then a {workload_seconds:g} s window. Figures: its BPF program's run time per sample
  (bpf_stats), and the agent's own CPU per second (naming the frames), the C workload's the peer
  of the others'.
- **Off-CPU.** `bench/ping_pong.c` (`gcc -O2 -fno-omit-frame-pointer`): two processes pinned to
  one CPU bounce a byte over two pipes, two context switches a round trip. Each round runs it
  alone (the baseline), under pycollector with `off_cpu_threshold: 1.0` (every switch off a CPU
  recorded with its stacks; CPU samples at {hz} Hz as above) and under `offcputime-bpfcc -f`,
  rotated; a profiler settles over a {settle_seconds:g} s run before the {workload_seconds:g} s
  window. {offcputime_attach} Overhead: 1 − round trips per second under the profiler / the same
  round's baseline. BPF: bpf_stats' run time of the profiler's program on the context switch
  (pycollector's includes the stack walks it tail-calls) per run and per second of window; CPU:
  the profiler's process tree's. Off-CPU seconds recorded: pycollector's `off_cpu/nanoseconds`
  profiles of ping_pong's processes, offcputime's folded lines of ping_pong, over both runs, per
  second of them. Sharing a CPU, each of the two waits while the other runs: about 1 s per s.
  pycollector walks ping_pong's user stacks with its unwind tables, offcputime with the kernel's
  frame-pointer walk (ping_pong has frame pointers, so both stacks are whole).
  The same window again with the two bouncing a turn through a futex word in a shared page
  (`ping_pong SECONDS CPU futex`: every wait a lock wait). A fourth mode, pycollector with
  `lock_profiling` and `io_profiling` on (`wait_events_per_second: 100000`), is compared with
  off-CPU alone: its BPF run time per switch, the goal at most 1.3 times. (BCC's offwaketime needs
  kprobes, which this kernel lacks: no row compares with it.)
- **Span context.** `tests/native/otel_thread_ctx_main.c` linked with the C writer (the
  variable in the executable: local-exec), one copy per CPU running in two spans, under
  pycollector at {hz} Hz as above; rotated, the copies either publish their process context
  (so every sample reads the thread's record, its span and its attributes) or do not (the
  kernel finds no variable for them: one map lookup). BPF: bpf_stats' run time per sample over
  the {workload_seconds:g} s window. The Python writer: a subprocess of this venv's Python with
  the OpenTelemetry SDK (no span processor: the span's own cost), the best of five passes of
  20000 `start_as_current_span` with an `http.route` attribute, and the best of three passes of
  50000 `await asyncio.sleep(0)` in a task inside a span, with the writer on
  (`OTEL_PYTHON_CONTEXT=pycollector_thread_context`) and off, rotated.
- **Memory.** Two programs, each on the host's last CPU and timing itself on its CPU clock (which
  takes in the uprobes' BPF, run in its context, and leaves out time other processes take): a
  loop of malloc(64) and free (`bench/heap_sampler.c`, `gcc -O2`, {memory_loop_iterations} round
  trips a run), and json.dumps and json.loads of a {memory_json_orders}-order document
  ({memory_json_round_trips} round trips a run, after one of warm-up) in Debian's python3 with
  sdk/python installed in a venv. Each round runs them, rotated: alone (the loop without the
  library; the script without `PYCOLLECTOR_HEAP_SAMPLE_BYTES`, so the .pth imports nothing), with
  the sampler loaded and no profiler (sdk/native's library `LD_PRELOAD`ed; the Python sampler on
  at 512 KiB), and with a pycollector agent attached (`allocation_profiling` and
  `live_heap_profiling` on, CPU samples at {hz} Hz as above): the program waits until the agent
  has raised its probes' semaphores and settled {settle_seconds:g} s, so every sampled allocation
  and its free fire a uprobe at the default interval (512 KiB) and within the default budget
  (1000 walked a second). The loop also runs under Debian's `heaptrack`, which records every
  call, on a tenth of the round trips (its figure is per round trip); heaptrack_print's summary
  is printed as the bench runs. Slowdown: the figure over the same round's alone. BPF: bpf_stats'
  run time of the agent's memory_alloc and memory_free programs (with the stack walks they
  tail-call) per run over the timed part. Allocations recorded: alloc_objects (the sampled ones)
  and alloc_space of the loop's process in the agent's reports, over the loop's malloc calls and
  bytes.
- **Pipeline.** A `pycollector` process runs otlp receiver (gRPC) → batch (defaults) → otlp_grpc
  exporter (uncompressed) → a sink in the bench. {senders} client threads, each waiting for its
  answer before sending again as agents do, stream requests to it for {stream_seconds:g} s, timed
  until the sink has every sample; CPU and RSS are the collector's (RSS right after the stream,
  less what it held started and idle). Two sets of requests, each through a collector of its own:
  the bench's host reports (ProfilesBuilder: {processes} processes, stacks 8–64 frames deep through
  shared libraries and the kernel, one shared dictionary; {bench_count} of them, about
  {bench_samples} samples and {bench_kib} KiB each), and real agent reports (`bench/agent_reports.py
  capture`: the profiling receiver at its defaults on this host made busy with every known
  workload; {agent_count} of them, about {agent_samples} samples and {agent_kib} KiB each). Peers,
  in the same rounds: decoding and re-encoding the same requests in one Python process (`python -m
  bench.raw_codec`); and a grpcio server that answers each request of the same stream and does
  nothing else (`python -m bench.grpc_floor`, built as the otlp receiver's), the most any gateway
  on Python's gRPC server can take. A sample is one `Sample` message.
- **Gateway workers.** The Pipeline's gateway on the agent reports, once with `service::workers: 1`
  and once with a worker per usable core (`bench/gateway_workers.py`), from {senders} clients each
  on a connection of its own with 2 requests in flight, new connections every round (the kernel
  gives each connection to a worker by a hash of its addresses: a round's split is a draw). The
  same rounds measure raw decode+encode and grpcio's do-nothing server. CPU is the gateway's
  process tree (supervisor and workers); RSS the largest worker's above its idle size. The clients
  and the sink run on the same CPUs: their CPU per sample, and what the host left idle, during
  the many-worker stream say how much of the host the gateway could have had.
- **Agent memory.** pycollector (the Agent cost config) profiles this host made busy with one
  copy of every known workload (C, Rust, Go, Node, Java, and the Python one under each of pyenv's
  CPython 3 versions; `bench/agent_reports.py`) for {agent_memory_seconds:g} s, its RSS read every
  {agent_memory_interval:g} s: the RSS at the end against its own after a minute (caches filled,
  first reports sent), and its peak.
- **Crowded host.** {crowded_processes} CPython processes (Debian's python3 running the known 75/25
  workload as nobody) keep the CPUs busy; pycollector starts with `deploy/systemd/config.yaml`
  (sending to the bench's sink) as root, and raises its own priority (`pycollector/priority.py`;
  the unit's `Nice=-10` does it from exec). Figures: launch to "pycollector started" against the
  same start on the idle host in the same round, and the agent's CPU (process tree) from
  {crowded_window[0]:g} to {crowded_window[1]:g} s after its start.
- **Persistent queue.** The same pipeline in two `pycollector` processes, the exporter's
  `sending_queue` in a `file_storage` extension (SQLite, WAL, no fsync) in one and in memory in the
  other, the same bursts sent to each in turn; bytes written are the process's `write_bytes` in
  /proc/PID/io over the burst.
"""


def write(path: Path, rows: list[Row], settings: Settings, loads: list[str], seconds: float, pipeline_shape: dict, warm_up_seconds: float) -> None:
    lines = ["# pycollector benchmarks", "", f"Written by `make bench` (`python -m bench`, {settings.name} mode, {settings.rounds} rounds) in {seconds / 60:.1f} minutes.", ""]
    lines += table(["Machine", ""], _machine(loads))
    lines += ["", "## Results", ""]
    lines += table(HEADER, [row.cells() for row in rows])
    method = METHOD.format(**vars(settings) | pipeline_shape, warm_up_seconds=warm_up_seconds, offcputime_attach=_offcputime_attach())
    lines += ["", "## How each figure is measured", "", *_rewrapped(method)]
    path.write_text("\n".join(lines) + "\n")


def _offcputime_attach() -> str:
    if peers.KPROBE_PMU.exists():
        return "offcputime-bpfcc runs as installed, on a kprobe on finish_task_switch."
    return ("offcputime-bpfcc attaches to a kprobe on finish_task_switch, and this kernel has no kprobes: it runs as "
            "installed but for its program, which `bench/offcputime_sched_switch.py` moves to the sched_switch raw "
            "tracepoint, taking the leaving thread's stacks there (the port BCC's libbpf-tools offcputime made), noting "
            "its time after them, and reading thread ids at the running kernel's offsets (the tool's kernel headers "
            "are Debian's 6.1).")


def _rewrapped(bullets: str) -> list[str]:
    """Each bullet refilled, since the values put into the text change its line lengths."""
    lines = []
    for bullet in bullets.split("\n- "):
        text = " ".join(bullet.removeprefix("- ").split())
        lines += textwrap.wrap(text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)
    return lines


def _machine(loads: list[str]) -> list[list[str]]:
    one_minute = [float(load.split()[0]) for load in loads]
    uname = os.uname()
    return [
        ["host", uname.nodename],
        ["CPU", f"{_cpu_model()}, {procfs.online_cpus()} CPUs, {'hardware PMU' if Path('/sys/bus/event_source/devices/cpu').exists() else 'no hardware PMU (software cpu-clock only)'}"],
        ["kernel", f"{uname.sysname} {uname.release} {uname.version}"],
        ["Python", platform.python_version()],
        ["date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")],
        ["load (1, 5, 15 min)", f"before: {loads[0]}; after: {loads[-1]}; 1-min load at the start of each window: {min(one_minute):.2f}–{max(one_minute):.2f} (the workload alone makes {procfs.online_cpus()}; the rest is other work on the host)"],
    ]


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def table(header: list[str], body: list[list[str]]) -> list[str]:
    def line(cells):
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return [line(header), line(["---"] * len(header)), *map(line, body)]
