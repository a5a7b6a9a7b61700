"""Two versions of one service, told apart by their service.version: each turn of the loop spends
HOT_SHARE of its CPU time in `hot` and the rest in `cold`, so a CPU profile of the process puts
that share of its samples under hot (version 1 ships with 0.2, version 2 with 0.6). The turns
are of the thread's CPU time, not the clock's: on a busy host a wall-clock split gives whichever
function was running when the CPU was taken away less than its share (ci4 of session 29: version
1's hot had 30% of its samples).

Usage: OTEL_RESOURCE_ATTRIBUTES=service.version=2 python versioned_split.py SECONDS HOT_SHARE
The resource is published for profilers by pycollector's Python writer (sdk/python)."""

import sys
import time

import pycollector_otel_context

TURN_SECONDS = 0.02


def hot(until):
    x = 1
    while time.thread_time() < until:
        x = (x * 6364136223846793005 + 1) & 0xFFFFFFFF
    return x


def cold(until):
    x = 1
    while time.thread_time() < until:
        x = (x * 2862933555777941757 + 3) & 0xFFFFFFFF
    return x


def main(seconds, hot_share):
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        start = time.thread_time()
        hot(start + hot_share * TURN_SECONDS)
        cold(start + TURN_SECONDS)


if __name__ == "__main__":
    pycollector_otel_context.enable()  # publishes OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
    main(float(sys.argv[1]), float(sys.argv[2]))
