"""What the tests of our two heap samplers share (sdk/native's libpycollector_heap.so and
sdk/python's pycollector_heap): reading their test trace as a profiler would have received it,
checking their probes' notes, and installing the Python sampler where site starts it.

The trace (PYCOLLECTOR_HEAP_SAMPLE_TRACE, heap_sampling.h): both semaphores raised as an attached
profiler raises them, one line per probe fired, ``alloc PID PTR SIZE WEIGHT CALLER`` and
``free PID PTR`` (CALLER: the native sampler's calling function, the Python sampler's domain).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SDK_PYTHON = REPO / "sdk" / "python"
DEBIAN_PYTHON = "/usr/bin/python3"


@dataclasses.dataclass
class Alloc:
    size: int
    weight: int
    caller: str


@dataclasses.dataclass
class Replay:
    """One process's probes in order: what a live-heap profiler would hold at the end."""
    allocs: list[Alloc]
    live: dict[int, Alloc]
    frees: int
    problems: list[str]

    def weights(self) -> collections.Counter:
        return collections.Counter({caller: sum(a.weight for a in self.allocs if a.caller == caller) for caller in {a.caller for a in self.allocs}})


def events(trace: Path) -> list[list[str]]:
    return [line.split() for line in trace.read_text().splitlines()]


def replay(lines: list[list[str]], pid: str, inherited: set[int] = frozenset()) -> Replay:
    """``inherited``: blocks that may be alive from the parent (a forked child's): freed or reused
    without a problem."""
    live: dict[int, Alloc] = {}
    inherited = set(inherited)
    allocs, frees, problems = [], 0, []
    for kind, line_pid, ptr, *rest in lines:
        if line_pid != pid:
            continue
        address = int(ptr, 16)
        if kind == "alloc":
            inherited.discard(address)
            size, weight, caller = int(rest[0]), int(rest[1]), rest[2].removesuffix(".cold")
            if address in live:
                problems.append(f"alloc of {ptr}, sampled and not freed")
            live[address] = Alloc(size, weight, caller)
            allocs.append(live[address])
        else:
            frees += 1
            if address in inherited:
                inherited.discard(address)
            elif live.pop(address, None) is None:
                problems.append(f"free of {ptr}, never sampled (or freed twice)")
    return Replay(allocs, live, frees, problems)


def _output(command: list[str]) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def assert_probes_and_semaphores(library: Path) -> dict[str, list[str]]:
    """Where a profiler finds them: otel_memory:alloc with 3 arguments and otel_memory:free with 1,
    each 8 bytes wide, each with a semaphore in the writable .probes section at the address of the
    semaphore variable the library reads. Returns each probe's arguments as the note writes them."""
    notes = _output(["readelf", "-n", str(library)])
    probes = {}
    for block in re.findall(r"Provider: (\S+)\s+Name: (\S+)\s+Location: (\S+), Base: (\S+), Semaphore: (\S+)\s+Arguments: ([^\n]*)", notes):
        provider, name, location, base, semaphore, arguments = block
        probes[(provider, name)] = (int(location, 16), int(semaphore, 16), arguments.split())
    assert set(probes) == {("otel_memory", "alloc"), ("otel_memory", "free")}
    assert len(probes["otel_memory", "alloc"][2]) == 3 and len(probes["otel_memory", "free"][2]) == 1
    for _, _, arguments in probes.values():
        assert all(re.fullmatch(r"-?8@\S+", argument) for argument in arguments), arguments

    sections = _output(["readelf", "-SW", str(library)])
    match = re.search(r"\]\s+\.probes\s+PROGBITS\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S+)", sections)
    assert match, ".probes section missing"
    start, size, flags = int(match[1], 16), int(match[2], 16), match[3]
    assert "W" in flags and "A" in flags
    symbols = {name: int(value, 16) for value, _, name in (line.split() for line in _output(["nm", str(library)]).splitlines() if len(line.split()) == 3)}
    for name in ("alloc", "free"):
        semaphore = probes["otel_memory", name][1]
        assert start <= semaphore < start + size
        assert symbols[f"otel_memory_{name}_semaphore"] == semaphore
    return {name: arguments for (_, name), (_, _, arguments) in probes.items()}


def install_python_sampler(python: str, directory: Path, packages: tuple[str, ...] = ()) -> Path:
    """A virtual environment in ``directory`` for the CPython ``python``, with sdk/python installed
    as pip installs it (pycollector_heap.pth in its site-packages, where site runs it at start-up;
    a .pth on PYTHONPATH would not run). Returns its python.

    The source is copied first (the `native` link as the files it names, as any copy of the folder
    has them), so builds for several interpreters do not share a build folder. Debian's python
    builds with its own setuptools, offline; another has pip fetch setuptools into an isolated
    build environment, and installs ``packages`` (with their dependencies) beside it."""
    source, venv = directory / "source", directory / "venv"
    shutil.copytree(SDK_PYTHON, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    debian = Path(python).resolve() == Path(DEBIAN_PYTHON).resolve()
    subprocess.run([python, "-m", "venv", *(["--system-site-packages", "--without-pip"] if debian else []), str(venv)],
                   check=True, capture_output=True, timeout=300)
    target = venv / "bin" / "python"
    if debian:
        install = [sys.executable, "-m", "pip", "--python", str(target), "install", "--no-build-isolation", "--no-index"]
    else:
        install = [str(target), "-m", "pip", "install", "--disable-pip-version-check"]
    wanted = ["--no-deps", str(source)] if debian or not packages else [str(source), *packages]
    done = subprocess.run([*install, "--quiet", *wanted], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"installing sdk/python for {python} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return target


def python_sampler_library(python: Path) -> Path:
    """The pycollector_heap extension that ``python`` imports."""
    return Path(_output([str(python), "-c", "import pycollector_heap; print(pycollector_heap.__file__)"]).strip())
