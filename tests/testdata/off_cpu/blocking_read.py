"""Off-CPU test workload, as blocking_read.c: compute 25 ms, then block in os.read() on a pipe
until a writer thread answers 75 ms later, for argv[1] seconds (after a 1 s sleep that lets the
profiler find this interpreter). Prints the nanoseconds spent blocked in os.read()."""
import os
import sys
import threading
import time


def compute(seconds):
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def answer(requests, answers):
    while os.read(requests, 1):
        time.sleep(0.075)
        os.write(answers, b"x")


def wait_for_data(requests, answers):
    os.write(requests, b"x")
    began = time.perf_counter_ns()
    os.read(answers, 1)
    return time.perf_counter_ns() - began


def main(seconds):
    requests, answers = os.pipe(), os.pipe()
    threading.Thread(target=answer, args=(requests[0], answers[1]), daemon=True).start()
    time.sleep(1.0)
    blocked, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        compute(0.025)
        blocked += wait_for_data(requests[1], answers[0])
    print(blocked, flush=True)


main(float(sys.argv[1]))
