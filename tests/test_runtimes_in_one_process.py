"""Two runtimes in one process (issue 42, finding 5): a JVM that loads libpython, as Jep does. The
kernel records each runtime's frames with a kind of its own (bpf/profile.h: CPython's 0 and 7,
V8's 1-3, HotSpot's 4-6), and each runtime attached to the process names the frames of its kinds
(symbols/runtime_stacks.py). Before, a process that mapped a CPython was Python's alone: its
Java frames went unnamed, and had the JVM been attached its walker would have read Python's
frames as Java ones (the tag's bits were shared).

tests/testdata/embedded: Embedded.java runs Java on one thread and, through JNI (embedded.c,
linked with Debian's libpython3.11, loaded after the JVM started), Python on its main thread.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import bpf_unavailable_reason, profile_a_run, samples_of
from tests.test_profiling_hotspot import jdk_tools

pytestmark = pytest.mark.bpf

HZ = 249
SECONDS = 6
EMBEDDED = Path(__file__).parent / "testdata" / "embedded"
ROOTS = {"__clone3", "clone3", "start_thread", "__libc_start_call_main", "_start"}


def build_embedded(work: Path) -> Path:
    """The JNI library (against Debian's python3-dev: scripts/setup.sh installs it) and the class."""
    java, javac, _ = jdk_tools()
    config = shutil.which("python3-config", path="/usr/bin")
    if config is None:
        pytest.fail("/usr/bin/python3-config should be on this machine (scripts/setup.sh installs python3-dev)")
    flags = subprocess.run([config, "--includes"], check=True, capture_output=True, text=True).stdout.split()
    links = subprocess.run([config, "--ldflags", "--embed"], check=True, capture_output=True, text=True).stdout.split()
    include = java.parent.parent / "include"
    library = work / "libembedded.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{include}", f"-I{include / 'linux'}", *flags, str(EMBEDDED / "embedded.c"), *links,
                    "-o", str(library)], check=True, capture_output=True)
    subprocess.run([str(javac), "-d", str(work), str(EMBEDDED / "Embedded.java")], check=True, capture_output=True)
    return library


def test_a_jvm_that_loads_libpython_has_its_java_and_its_python_frames_named(tmp_path):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    library = build_embedded(tmp_path)
    java, _, _ = jdk_tools()
    argv = [java, "-cp", tmp_path, "Embedded", library, SECONDS]
    # A first run leaves the unwind rows of libjvm and libpython in the cache (tmp_path/cache):
    # built cold, they take most of a run here, and the native frames between the runtimes' are
    # walked by them.
    profile_a_run(tmp_path, argv, HZ, "hotspot")
    profiled = profile_a_run(tmp_path, argv, HZ, "hotspot")
    python, walked, under_java, rooted, java_thread = 0, 0, 0, 0, 0
    kinds: collections.Counter = collections.Counter()
    by_thread: collections.Counter = collections.Counter()  # every sample, by thread
    python_threads = set()
    for view, count in samples_of(profiled):
        functions = [frame.function for frame in view.frames]
        kinds.update({frame.frame_type: count for frame in view.frames})
        by_thread[view.attributes.get("thread.id")] += count
        if "python_spin" in functions:
            python += count
            python_threads.add(view.attributes.get("thread.id"))
            # Walked natively through libpython to the JNI call (not in the first second or
            # two: libpython is loaded after the JVM starts, and its mapping and rows reach the
            # kernel a moment later): the whole stack is the Python frames where the eval loop
            # ran, the JNI call, the Java method that made it, to the thread's root.
            if "PyRun_SimpleStringFlags" in functions[functions.index("python_spin"):]:
                walked += count
                under_java += count * ("Embedded.main" in functions[functions.index("PyRun_SimpleStringFlags"):])
                rooted += count * (functions[-1] in ROOTS)
        if view.attributes.get("thread.name") == "java-spin" and any(frame.frame_type == "jvm" and (frame.function or "").startswith("Embedded.")
                                                                       for frame in view.frames):
            java_thread += count
    on_python_thread = sum(by_thread[thread] for thread in python_threads)
    print(f"python_spin {python} of {on_python_thread} samples of its thread (walked to the JNI call {walked}: under Embedded.main "
          f"{under_java}, rooted {rooted}); java-spin in Embedded's Java {java_thread}; frames by kind {dict(kinds)}")
    # (Of the samples of the thread that ran Python, not of the run's seconds: on a loaded host
    # the thread gets less of a CPU, not fewer names. It starts the JVM and CPython first.)
    assert on_python_thread >= HZ * SECONDS * 0.15 and python >= 0.5 * on_python_thread, \
        "the Python frames of a JVM's embedded CPython are named"
    assert java_thread >= HZ * SECONDS * 0.5 * 0.2, "the JVM's Java frames are named beside its Python ones"
    assert walked >= 0.3 * python
    assert under_java >= 0.9 * walked, "the Python frames sit on the Java method that called into Python"
    assert rooted >= 0.9 * walked
