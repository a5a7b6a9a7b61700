"""The walker's path through a live interpreter, done in Python (walk.py), finds each thread's
stack as the interpreter itself reports it.

Each installed CPython runs three threads asleep in known functions (the main thread two calls
deep, one worker three, one one) while a fourth prints sys._current_frames(): per thread id
(pthread_self) its native id and its stack of (co_qualname or co_name, f_lineno), innermost
first. The test walks from the interpreters' head pointer (symbol + load bias) through every
PyThreadState, matches threads by thread_id (and from 3.11 native_thread_id), walks each one's
frames and names them with the code reader: each stack must equal the interpreter's. This checks
what the header probe cannot: which field holds what (the frame behind 3.11's _PyCFrame, shims
owned by the C stack, instruction pointers against co_code_adaptive).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from receivers.profiling.python.code import CodeCache
from receivers.profiling.python.detect import detect_cpython
from receivers.profiling.processes.memory import ProcessMemory
from receivers.profiling.python.walk import python_frames, thread_states

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cpython_code import _cases, _offsets  # noqa: E402
from test_cpython_offsets import load_bias  # noqa: E402

SCRIPT = r'''from __future__ import print_function
import json, sys, threading, time

try:
    from threading import get_ident
except ImportError:  # 2.7
    from thread import get_ident

ready = []


def asleep(event):
    event.set()
    time.sleep(120)


def leaf_a(event):
    asleep(event)


def middle_a(event):
    leaf_a(event)


class Worker(object):
    def run(self, event):
        return asleep(event)


def main_wait(event):
    asleep(event)


def stack_of(frame):
    out = []
    while frame is not None:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)
        out.append([name if sys.version_info[0] > 2 else name.decode("utf-8"), frame.f_lineno])
        frame = frame.f_back
    return out


def report():
    for event in ready:
        event.wait()
    time.sleep(0.3)  # from set() into time.sleep()
    me = get_ident()
    natives = {}
    for thread in threading.enumerate():
        natives[thread.ident] = getattr(thread, "native_id", None)
    stacks = {}
    for ident, frame in sys._current_frames().items():
        if ident != me:
            stacks[str(ident)] = {"native": natives.get(ident), "stack": stack_of(frame)}
    print(json.dumps(stacks))
    sys.stdout.flush()
    time.sleep(120)


def start(target):
    event = threading.Event()
    ready.append(event)
    thread = threading.Thread(target=target, args=(event,))
    thread.daemon = True
    thread.start()


start(middle_a)
start(Worker().run)
ready.append(threading.Event())
reporter = threading.Thread(target=report)
reporter.daemon = True
reporter.start()
main_wait(ready[2])
'''


@pytest.mark.parametrize("version,python,interpreter", _cases())
def test_each_threads_stack_as_the_interpreter_says(version, python, interpreter, tmp_path):
    if not python.exists() or interpreter is None:
        pytest.skip(f"{python} is not installed")
    cpython = detect_cpython(str(interpreter))
    script = tmp_path / "threads.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, LC_ALL="C.UTF-8", PYTHONDONTWRITEBYTECODE="1")
    process = subprocess.Popen([str(python), str(script)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        said = json.loads(process.stdout.readline())
        assert len(said) == 3
        offsets = _offsets(cpython, process.pid)
        head = cpython.interpreters_head(offsets) + load_bias(process.pid, cpython)
        cache = CodeCache()
        found = {}
        with ProcessMemory(process.pid) as memory:
            states = thread_states(memory, offsets, head)
            assert len(states) >= 4
            for state in states:
                if str(state.thread_id) not in said:
                    continue
                want = said[str(state.thread_id)]
                if offsets.thread_native_id is not None:
                    assert state.native_id == want["native"]
                frames = python_frames(memory, offsets, state.address)
                locations = [cache.locate(process.pid, memory, offsets, f.code, f.instruction) for f in frames]
                found[str(state.thread_id)] = [[location.function, location.line] for location in locations]
                assert frames[-1].first_of_call
        assert found == {ident: want["stack"] for ident, want in said.items()}
        names = sorted(stack[0][0] for stack in found.values())
        assert names == ["asleep"] * 3
    finally:
        process.kill()
        process.wait()

