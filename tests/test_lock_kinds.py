"""lock.kind from a lock wait's frames (receivers/profiling/waits/lock_kinds.py), on stacks as the
receiver names them (leaf first, the kernel's frames first): glibc's primitives, the runtimes'
locks built on them, and CPython's where its static functions have no names (Debian's python3)."""

from __future__ import annotations

import pytest

from receivers.profiling.symbols.frame import Frame
from receivers.profiling.waits.lock_kinds import lock_kind

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
APP = "/usr/bin/app"
PYTHON = "/usr/bin/python3.11"  # Debian's: libpython linked in, only .dynsym's names
LIBPYTHON = "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"
EXTENSION = "/usr/lib/python3/dist-packages/_native.cpython-311-x86_64-linux-gnu.so"

KERNEL = [Frame(0, "kernel", name, file="[kernel.kallsyms]") for name in (
    "__schedule", "schedule", "futex_wait_queue", "__futex_wait", "futex_wait", "do_futex", "__x64_sys_futex", "do_syscall_64",
    "entry_SYSCALL_64_after_hwframe")]

# glibc's frames of each primitive's wait, leaf first.
COND_TIMEDWAIT = ["__futex_abstimed_wait_common", "__pthread_cond_wait_common", "___pthread_cond_timedwait64"]
MUTEX_LOCK = ["__lll_lock_wait", "___pthread_mutex_lock"]
SEM_CLOCKWAIT = ["__futex_abstimed_wait_common", "do_futex_wait", "__new_sem_wait_slow64", "___sem_clockwait"]


def libc(*names: str) -> list[Frame]:
    return [Frame(0x7F0000001000, "native", name, file=LIBC) for name in names]


def native(file: str, *names: str | None) -> list[Frame]:
    return [Frame(0x401000, "native", name, file=file) for name in names]


def python(*functions: str) -> list[Frame]:
    return [Frame(0, "cpython", name) for name in functions]


@pytest.mark.parametrize("user, kind", [
    (libc(*MUTEX_LOCK) + native(APP, "hold_and_wait", "worker") + libc("start_thread", "clone3"), "mutex"),
    (libc("__futex_abstimed_wait_common", "__pthread_cond_wait_common", "___pthread_cond_wait") + native(APP, "wait_for_work", "main"), "condvar"),
    (libc("__futex_abstimed_wait_common", "__pthread_rwlock_wrlock_full64", "___pthread_rwlock_wrlock") + native(APP, "update", "main"), "rwlock"),
    (libc("__futex_abstimed_wait_common", "do_futex_wait", "__new_sem_wait_slow64") + native(APP, "consume", "main"), "semaphore"),
    (libc("__futex_abstimed_wait_common", "__pthread_clockjoin_ex") + native(APP, "main"), "join"),
    # CPython with its symbols (pyenv's libpython): the GIL's wait is a condition variable's,
    # threading.Lock's a semaphore's.
    (libc(*COND_TIMEDWAIT) + native(LIBPYTHON, "take_gil", "PyEval_RestoreThread", "time_sleep") + python("sleepy"), "gil"),
    (libc(*COND_TIMEDWAIT) + native(LIBPYTHON, "take_gil", "_PyEval_AcquireLock", "_PyThreadState_Attach", "_Py_HandlePending") + python("spin"), "gil"),
    (libc(*MUTEX_LOCK) + native(LIBPYTHON, "take_gil", "_Py_HandlePending") + python("spin"), "gil"),
    (libc(*SEM_CLOCKWAIT) + native(LIBPYTHON, "PyThread_acquire_lock_timed", "acquire_timed", "lock_PyThread_acquire_lock") + python("take_it"),
     "python_lock"),
    # Debian's python3.11: take_gil has no name; the eval loop (the Python function's frame) called it.
    (libc(*COND_TIMEDWAIT) + native(PYTHON, None) + python("spin_alpha", "run", "_bootstrap_inner", "_bootstrap")
     + native(PYTHON, None, "_PyObject_Call", None) + libc("start_thread", "clone3"), "gil"),
    (libc(*MUTEX_LOCK) + native(PYTHON, None) + python("spin_alpha") + native(PYTHON, "PyObject_Call"), "gil"),
    # the 3.12/3.13 shape: take_gil <- (_PyEval_AcquireLock, _PyThreadState_Attach) <- _Py_HandlePending
    (libc(*COND_TIMEDWAIT) + native(PYTHON, None, None, None) + python("spin") + native(PYTHON, "Py_RunMain"), "gil"),
    # take_gil inlined into the eval loop: the wait's caller is the Python function
    (libc(*COND_TIMEDWAIT) + python("spin") + native(PYTHON, "Py_RunMain"), "gil"),
    # drop_gil's wait for another thread to take it (FORCE_SWITCHING), inlined in PyEval_SaveThread
    (libc("__futex_abstimed_wait_common", "__pthread_cond_wait_common", "___pthread_cond_wait") + native(PYTHON, "PyEval_SaveThread", None)
     + python("read_it"), "gil"),
    (libc(*SEM_CLOCKWAIT) + native(PYTHON, "PyThread_acquire_lock_timed", None, None) + python("take_it") + native(PYTHON, "Py_RunMain"),
     "python_lock"),
    # (PyThread_acquire_lock_timed inlined where it is called)
    (libc(*SEM_CLOCKWAIT) + native(PYTHON, None, None) + python("take_it") + native(PYTHON, "Py_RunMain"), "python_lock"),
    # 3.13 (pyenv's, named): Thread.join waits on a PyEvent through the parking lot; a PyMutex likewise.
    (libc("__futex_abstimed_wait_common", "__new_sem_wait_slow64.constprop.0") + native(LIBPYTHON, "_PySemaphore_Wait", "_PyParkingLot_Park",
                                                                                  "PyEvent_WaitTimed", "ThreadHandle_join",
                                                                                  "PyThreadHandleObject_join") + python("join"), "join"),
    (libc("__futex_abstimed_wait_common", "__new_sem_wait_slow64.constprop.0") + native(LIBPYTHON, "_PySemaphore_Wait", "_PyParkingLot_Park",
                                                                                  "_PyMutex_LockTimed", "PyMutex_Lock") + python("f"), "python_lock"),
    # HotSpot: synchronized, and LockSupport.park.
    (libc("__futex_abstimed_wait_common", "___pthread_cond_wait") + native("/jvm/libjvm.so", "PlatformEvent::park", "ObjectMonitor::EnterI",
                                                                              "ObjectMonitor::enter", "ObjectSynchronizer::enter",
                                                                              "InterpreterRuntime::monitorenter"), "monitor"),
    (libc("__futex_abstimed_wait_common", "___pthread_cond_timedwait64") + native("/jvm/libjvm.so", "Parker::park", "Unsafe_Park"), "park"),
    # Go's runtime waits on the futex itself.
    (native("/go/app", "runtime.futex", "runtime.futexsleep", "runtime.notesleep", "runtime.stopm", "runtime.findRunnable"), "go_runtime"),
    # A program's own futex.
    (libc("syscall") + native(APP, "my_own_futex_wait", "main"), "futex"),
    (native(APP, None, None, "main"), "futex"),
])
def test_the_kind_is_the_primitive_or_the_runtimes_lock_built_on_it(user, kind):
    assert lock_kind(KERNEL + user) == kind


def test_a_runtimes_name_far_from_the_primitive_does_not_claim_the_wait():
    """A C extension called from Python that waits on its own mutex is a mutex wait: the
    interpreter's frames further out are not the lock."""
    user = libc(*MUTEX_LOCK) + native(APP, *[f"extension_{n}" for n in range(8)]) + native(PYTHON, "PyThread_acquire_lock_timed")
    assert lock_kind(KERNEL + user) == "mutex"


@pytest.mark.parametrize("caller", [None, "wait_for_work"])
def test_an_extensions_own_condvar_called_from_python_is_not_the_gil(caller):
    """A C extension's function the eval loop called, stripped or not, that waits on a condition
    variable: its file is not the interpreter's, whatever Python frames are further out."""
    user = libc(*COND_TIMEDWAIT) + native(EXTENSION, caller) + python("use_the_extension") + native(PYTHON, "_PyObject_Call", "Py_RunMain")
    assert lock_kind(KERNEL + user) == "condvar"


def test_unnamed_code_of_a_file_not_shown_to_be_cpython_is_not_the_interpreter():
    """A condition variable waited on from a stripped program with Python frames elsewhere in no
    named frame of its file: the program's own wait."""
    user = libc(*COND_TIMEDWAIT) + native(APP, None, None) + python("embedded") + native(LIBPYTHON, "PyObject_Call")
    assert lock_kind(KERNEL + user) == "condvar"
