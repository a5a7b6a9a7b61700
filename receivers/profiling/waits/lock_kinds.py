"""What a thread blocked in a futex wait was waiting for (the ``lock.kind`` attribute of a
lock_wait sample), told from its stack.

Every user-space lock on Linux parks its waiters in the kernel the same way (a futex wait), so the
kernel's side of a lock wait says nothing of the lock; the frames above it do. Two levels name it:

- the C library's primitive nearest the wait: a mutex, a read-write lock, a semaphore, a condition
  variable (a wait for a condition, not contention: kept apart), a thread join;
- a runtime's lock built on one of those, a few frames further out: CPython's GIL (``take_gil``
  waits on a condition variable) and its ``threading.Lock`` (``PyThread_acquire_lock_timed`` waits
  on a semaphore), HotSpot's monitors (``synchronized``) and ``LockSupport.park`` (both park on a
  condition variable), Go's runtime locks and notes (``runtime.futexsleep``, the futex directly).

The runtime's name wins when it is within RUNTIME_REACH frames of the primitive: it is what the
program's author wrote. A wait nothing here recognises is ``futex``.

A CPython without symbols for its static functions (Debian's and Ubuntu's python3: libpython
linked into the executable, which keeps only .dynsym) has no ``take_gil`` to find: its GIL wait
reads ``pthread_cond_timedwait`` <- (unnamed code of python3.11) <- the Python function the eval
loop ran. So a wait whose primitive is called from unnamed code of the interpreter's own file (a
file that named frames of the same stack show to be CPython's: ``PyObject_Call``,
``_PyEval_EvalFrameDefault``...), or straight from the eval loop (take_gil inlined there: the
walker puts the Python function's frame where the eval loop's was), is the interpreter's: a condition variable or mutex there is the
GIL (take_gil's and drop_gil's; CPython's other locks on Linux are semaphores), a semaphore a
Python lock (``PyThread_acquire_lock_timed`` inlined). A C extension's unnamed code is in its own
file, and stays the primitive it waits on.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Protocol

MUTEX, RWLOCK, CONDVAR, SEMAPHORE, JOIN = "mutex", "rwlock", "condvar", "semaphore", "join"
GIL, PYTHON_LOCK, MONITOR, PARK, GO_RUNTIME = "gil", "python_lock", "monitor", "park", "go_runtime"
FUTEX = "futex"  # a futex wait that is none of these (a program's own futex, an unknown library)

# The C library's primitives, as glibc's (and musl's) symbols name them: versioned aliases and
# internal helpers (___pthread_mutex_lock, __pthread_mutex_lock_full, __lll_lock_wait,
# __pthread_cond_wait_common, __new_sem_wait_slow64, __pthread_rwlock_wrlock_full64) included.
_PRIMITIVES = (
    (CONDVAR, re.compile(r"pthread_cond_(?:timed|clock)?wait|__pthread_cond_wait_common|^cnd_(?:timed)?wait")),
    (RWLOCK, re.compile(r"pthread_rwlock_(?:timed|clock)?(?:rd|wr)lock|__pthread_rwlock_(?:rd|wr)lock")),
    (SEMAPHORE, re.compile(r"sem_(?:timed|clock)?wait|__new_sem_wait|do_futex_wait")),
    (JOIN, re.compile(r"pthread_(?:timed|clock|try)?join|__pthread_clockjoin|^thrd_join")),
    (MUTEX, re.compile(r"pthread_mutex_(?:timed|clock)?lock|__lll_lock_wait|__pthread_mutex_lock|^mtx_(?:timed)?lock")),
)
# Runtimes' locks, each built on a primitive (or, Go's, on the futex itself).
_RUNTIMES = (
    # (drop_gil: with FORCE_SWITCHING a thread that drops the GIL waits until another takes it,
    # in PyEval_SaveThread where it is inlined; _PyEval_AcquireLock: 3.12+'s take_gil caller)
    (GIL, re.compile(r"^(?:take_gil|drop_gil|PyEval_RestoreThread|PyEval_AcquireThread|PyEval_SaveThread|_PyEval_AcquireLock)$")),
    # (3.13+: PyMutex, parked through _PyParkingLot_Park on a semaphore; threading.Lock's from 3.14)
    (PYTHON_LOCK, re.compile(r"^PyThread_acquire_lock(?:_timed)?$|^acquire_timed$|^lock_PyThread_acquire_lock$|^rlock_acquire$"
                             r"|^_?PyMutex_Lock(?:Timed|Flags)?\b")),
    # Thread.join from 3.13: a PyEvent waited on through the parking lot, a semaphore's wait
    (JOIN, re.compile(r"^(?:ThreadHandle_join|PyThreadHandleObject_join|PyThread_join_thread)$")),
    (MONITOR, re.compile(r"ObjectMonitor::(?:enter|EnterI|ReenterI|wait)|ObjectSynchronizer::")),
    (PARK, re.compile(r"Parker::park|Unsafe_Park|LockSupport\.park")),
    (GO_RUNTIME, re.compile(r"^runtime\.(?:futexsleep|notesleep|notetsleep|lock2|semasleep)")),
)
# How many frames beyond the primitive a runtime's lock may be (take_gil -> pthread_cond_timedwait
# is 1 to 3 frames by build; HotSpot's ObjectMonitor::EnterI -> PlatformEvent::park ->
# pthread_cond_wait 2 to 4).
RUNTIME_REACH = 6

# The names that show a file is a CPython interpreter (libpython, or an executable linked with it):
# its C API and its eval loop, which every stack through the interpreter has some of (PyObject_Call,
# _PyFunction_Vectorcall, Py_RunMain, the eval loop the Python walker did not replace).
_CPYTHON_NAME = re.compile(r"^_?Py[A-Z_]|^PyEval_EvalFrameEx$")
INTERPRETED = "cpython"  # the kind of a Python function's frame (python/interpreters.py FRAME_KIND)
# The interpreter's waits on each primitive, where it is not named (see the module's docstring).
_INTERPRETER_WAITS = {CONDVAR: GIL, MUTEX: GIL, SEMAPHORE: PYTHON_LOCK}


class NamedFrame(Protocol):
    """What lock_kind reads of a frame (symbols/frame.py's Frame has it)."""

    name: str | None
    kind: str  # "kernel", "native", "cpython"...
    file: str | None  # the mapped file of a native frame


def lock_kind(frames: Sequence[NamedFrame]) -> str:
    """The kind of lock a futex wait was for, from its frames, leaf first (kernel frames may be
    there: they match nothing)."""
    return _lock_kind(tuple((frame.name or "", frame.kind, frame.file) for frame in frames))


# (Cached: the lock waits of a report share few stacks, each in many samples, one a thread;
# 10,000 threads waiting in one place were 10,000 regex scans of the same frames a report.)
@functools.lru_cache(maxsize=4096)
def _lock_kind(frames: tuple[tuple[str, str, str | None], ...]) -> str:
    names = [name for name, _kind, _file in frames]
    for at, name in enumerate(names):
        runtime = _runtime(name)
        if runtime is not None:
            return runtime
        primitive = next((kind for kind, pattern in _PRIMITIVES if pattern.search(name)), None)
        if primitive is not None:
            outer = next((kind for kind in map(_runtime, names[at + 1: at + 1 + RUNTIME_REACH]) if kind is not None), None)
            if outer is not None:
                return outer
            if primitive in _INTERPRETER_WAITS and _called_by_unnamed_interpreter_code(frames, at):
                return _INTERPRETER_WAITS[primitive]
            return primitive
    return FUTEX


def _runtime(name: str) -> str | None:
    return next((kind for kind, pattern in _RUNTIMES if pattern.search(name)), None)


def _called_by_unnamed_interpreter_code(frames: tuple[tuple[str, str, str | None], ...], primitive_at: int) -> bool:
    """Whether the primitive at ``primitive_at`` was called by the interpreter where it has no
    names: past the C library's frames (the primitive's file), the caller is the eval loop itself
    (a Python function's frame: the walker put them where the eval loop's frame was), or code
    without a name in a file that a frame of the same stack, named as CPython's, shows to be
    the interpreter. (Frames as (name, kind, file).)"""
    library = frames[primitive_at][2]
    at = primitive_at + 1
    while library and at < len(frames) and frames[at][2] == library:
        at += 1
    if at >= len(frames):
        return False
    name, kind, file = frames[at]
    if kind == INTERPRETED:
        return True
    if name or not file:
        return False
    return any(other_file == file and other_name and _CPYTHON_NAME.search(other_name) for other_name, _kind, other_file in frames)
