"""An application instrumented with the OpenTelemetry SDK and pycollector's Python writer
(sdk/python), for tests/test_python_context_writer.py. Run with OTEL_PYTHON_CONTEXT set:

    python python_context_writer.py steps      # commands on stdin, one answer line each
    python python_context_writer.py asyncio    # checks its own records across task switches

steps: ``ready`` (answers "ready"), ``start ROUTE`` (a span, attached; answers "TRACE SPAN VARIABLE_ADDRESS" in hex),
``route VALUE`` (sets http.route on it), ``end`` (detaches and ends it), ``fork`` (a child that
starts a span and answers "child PID"; it lives until killed).

asyncio: tasks in spans of their own and one in none take turns on one loop, each checking at
every turn that its thread's record holds its span (read back from the variable), then a pool
thread is checked clean after a job run in its caller's context; prints "turns N mismatches M".
"""

import asyncio
import contextvars
import ctypes
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from pycollector_otel_context import _native

trace.set_tracer_provider(TracerProvider(resource=Resource.create({"service.name": "writer-test", "service.version": "7"})))
tracer = trace.get_tracer("python_context_writer")


def ids(span) -> tuple:
    span_context = span.get_span_context()
    return span_context.trace_id.to_bytes(16, "big"), span_context.span_id.to_bytes(8, "big")


def my_record():
    """(trace id, span id) of this thread's record, or None: what a reader would find."""
    pointer = ctypes.c_void_p.from_address(_native.thread_context_address()).value
    if not pointer:
        return None
    raw = ctypes.string_at(pointer, 25)
    return (raw[:16], raw[16:24]) if raw[24] == 1 else None


def steps() -> None:
    span = token = None
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "ready":
            print("ready", flush=True)
        elif command == "start":
            span = tracer.start_span("GET " + argument, attributes={"http.route": argument})
            token = context.attach(trace.set_span_in_context(span))
            trace_id, span_id = ids(span)
            print(trace_id.hex(), span_id.hex(), f"{_native.thread_context_address():x}", flush=True)
        elif command == "route":
            span.set_attribute("http.route", argument)
            print("ok", flush=True)
        elif command == "end":
            context.detach(token)
            span.end()
            print("ok", flush=True)
        elif command == "fork":
            pid = os.fork()
            if pid == 0:
                with tracer.start_as_current_span("child"):
                    say(f"child {os.getpid()}")
                    while True:
                        time.sleep(1)
            say("forked")


def say(line: str) -> None:
    """``line`` in one write: the parent and its forked child share the pipe, and print() writes
    each piece on its own when stdout is unbuffered (PYTHONUNBUFFERED=1 on these machines: ci21 read
    "childforked" and " 26815")."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def in_span(name: str, turns: int, result: list) -> None:
    with tracer.start_as_current_span(name) as span:
        for _ in range(turns):
            result[0] += 1
            result[1] += my_record() != ids(span)
            await asyncio.sleep(0)


async def in_no_span(turns: int, result: list) -> None:
    for _ in range(turns):
        result[0] += 1
        result[1] += my_record() is not None
        await asyncio.sleep(0)


def job_in_span() -> None:
    with tracer.start_as_current_span("job"):
        pass


async def pool_thread_left_clean(result: list) -> None:
    """A job run in the caller's context (run_in_executor with a copied context, as
    asyncio.to_thread does) must not leave the caller's span in the pool thread's record."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        with tracer.start_as_current_span("caller"):
            await loop.run_in_executor(pool, contextvars.copy_context().run, job_in_span)
        leftover = await loop.run_in_executor(pool, my_record)  # the same thread's next job
    result[0] += 1
    result[1] += leftover is not None


async def take_turns() -> list:
    result = [0, 0]
    await asyncio.gather(in_span("a", 300, result), in_no_span(300, result), in_span("b", 300, result))
    await pool_thread_left_clean(result)
    return result


if __name__ == "__main__":
    if sys.argv[1] == "steps":
        steps()
    else:
        turns, mismatches = asyncio.run(take_turns())
        after = my_record()  # the loop is gone: no span
        print("turns", turns, "mismatches", mismatches + (after is not None), flush=True)
