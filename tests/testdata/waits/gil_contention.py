"""GIL and threading.Lock waits of known length (tests/test_python_lock_waits.py), for any python3.

Prints "ready", then waits for a line on stdin (the test has the profiler find this interpreter
meanwhile). Then:

1. The GIL: four threads, each running its own CPU-bound function (spin_alpha ... spin_delta) for
   SECONDS; each measures the time it did not run in it: time.perf_counter() minus
   time.thread_time() over the call, which is its GIL waits, plus its waits for a CPU (the host's
   other work), also printed: run_delay, the time the thread sat runnable on a run queue
   (/proc/thread-self/schedstat). Prints "gil_wait_ns <function> N" and "run_delay_ns <function> N".
2. A threading.Lock: three threads take one lock in turn for SECONDS, each holding it HOLD_S
   asleep in hold_the_lock(); each measures the time lock.acquire() takes in
   wait_for_the_lock(). Prints "lock_wait_ns N" (all threads').

Prints "done", then stays until stdin closes (the profiler names Python frames from the
process's memory: it must still be there for the last report).
Usage: python3 gil_contention.py SECONDS
"""

import sys
import threading
import time

HOLD_S = 0.005
LOCKERS = 3


def run_delay_ns():
    """The time this thread has waited on a run queue (the second field of its schedstat)."""
    try:
        with open("/proc/thread-self/schedstat") as stream:
            return int(stream.read().split()[1])
    except OSError:
        return 0


# One CPU-bound function per thread, each its own code object, so each thread's GIL waits have
# a Python function of their own. The loop is bytecode only: the eval loop checks for a GIL drop
# request at its backward jumps, in the function itself.
def spin_alpha(deadline):
    total = 0
    while time.perf_counter() < deadline:
        for number in range(2000):
            total += number * number
    return total


def spin_bravo(deadline):
    total = 0
    while time.perf_counter() < deadline:
        for number in range(2000):
            total += number * number
    return total


def spin_charlie(deadline):
    total = 0
    while time.perf_counter() < deadline:
        for number in range(2000):
            total += number * number
    return total


def spin_delta(deadline):
    total = 0
    while time.perf_counter() < deadline:
        for number in range(2000):
            total += number * number
    return total


def measured(function, deadline, results):
    delay, wall, cpu = run_delay_ns(), time.perf_counter_ns(), time.thread_time_ns()
    function(deadline)
    waited = (time.perf_counter_ns() - wall) - (time.thread_time_ns() - cpu)
    results[function.__name__] = (waited, run_delay_ns() - delay)


def wait_for_the_lock(lock):
    began = time.perf_counter_ns()
    lock.acquire()
    return time.perf_counter_ns() - began


def hold_the_lock(lock):
    time.sleep(HOLD_S)
    lock.release()


def contend(lock, deadline, waited, index):
    while time.perf_counter() < deadline:
        waited[index] += wait_for_the_lock(lock)
        hold_the_lock(lock)


def run_all(threads):
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    print("ready", flush=True)
    sys.stdin.readline()

    results = {}
    deadline = time.perf_counter() + seconds
    run_all([threading.Thread(target=measured, args=(function, deadline, results))
             for function in (spin_alpha, spin_bravo, spin_charlie, spin_delta)])
    for name, (waited, delay) in sorted(results.items()):
        print(f"gil_wait_ns {name} {waited}")
        print(f"run_delay_ns {name} {delay}")

    lock, waited = threading.Lock(), [0] * LOCKERS
    deadline = time.perf_counter() + seconds
    run_all([threading.Thread(target=contend, args=(lock, deadline, waited, index)) for index in range(LOCKERS)])
    print(f"lock_wait_ns {sum(waited)}")
    print("done", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
