"""What the Python memory workloads share (py_alloc.py, py_heap.py): their phases, on signals. A
workload says "ready" once its handlers are in place, spins until SIGUSR1 (so the profiler sees it
on a CPU, attaches to its probes and finds its interpreter), allocates, and spins again until
SIGUSR2 (while the profiler reports what it still holds)."""

import signal

phase = 0


def _next_phase(number, _frame):
    global phase
    phase = 1 if number == signal.SIGUSR1 else 2


def ready():
    signal.signal(signal.SIGUSR1, _next_phase)
    signal.signal(signal.SIGUSR2, _next_phase)
    print("ready", flush=True)


def spin_until(wanted):
    while phase < wanted:
        pass
