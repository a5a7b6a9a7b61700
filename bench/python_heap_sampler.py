"""The Python heap sampler's cost (sdk/python's pycollector_heap) on an allocation-heavy Python
benchmark: json.dumps and json.loads of a large document (6.8 MB of JSON: dicts, lists, strings,
ints and floats; 2.7 million allocations, 280 MB, per round trip), in a CPython with
pycollector-otel-context installed into a virtual environment of its own:

  - without PYCOLLECTOR_HEAP_SAMPLE_BYTES: the .pth reads the variable and imports nothing;
  - with it, no profiler attached: the raw domain's requests pass through its hook, a load of the
    semaphore and a jump (the mem and object domains are hooked once a profiler listens): what
    every service with it switched on pays;
  - with the semaphores raised as an attached profiler raises them (the test trace, written to
    /dev/null): all three domains hooked, and the sampling itself at the default interval, without
    the uprobe a profiler adds per sampled allocation.

Rounds interleave the modes on one CPU (bench/heap_sampler.py's run_pinned and interleaved); each
figure is ms per dumps+loads, the mean of a run's round trips after a warm-up.

    python -m bench.python_heap_sampler [--rounds 7] [--iterations 10]

Prints figures; asserts nothing. tests/test_python_heap_sampler.py checks what it does.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench.heap_sampler import interleaved, report, run_pinned
from tests.heap_samplers import DEBIAN_PYTHON, install_python_sampler

MODES = ("sampler off", "on, no profiler", "on, semaphores raised")

BENCHMARK = r"""
import json, sys, time
iterations = int(sys.argv[1])
document = {"orders": [{"id": i, "customer": "customer-%d" % (i % 977), "total": i * 1.25, "paid": i % 3 == 0,
                        "lines": [{"sku": "sku-%d" % (i * 7 + j), "quantity": j, "price": j * 0.5} for j in range(5)]}
                       for i in range(20000)]}
json.loads(json.dumps(document))  # warm-up
began = time.perf_counter()
for _ in range(iterations):
    assert json.loads(json.dumps(document)) == document
print((time.perf_counter() - began) / iterations * 1000)
"""


def environment(mode: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LD_PRELOAD", "PYCOLLECTOR_HEAP_", "PYTHON"))}
    if mode != "sampler off":
        env["PYCOLLECTOR_HEAP_SAMPLE_BYTES"] = "524288"
    if mode == "on, semaphores raised":
        env["PYCOLLECTOR_HEAP_SAMPLE_TRACE"] = os.devnull
    return env


def measure(rounds: int, iterations: int, python: str = DEBIAN_PYTHON) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="pycollector-pyheap-bench-") as scratch:
        sampler_python = install_python_sampler(python, Path(scratch))
        return interleaved(MODES, rounds, lambda mode: run_pinned([str(sampler_python), "-c", BENCHMARK, str(iterations)], environment(mode)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.python_heap_sampler", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=10, help="dumps+loads round trips per run")
    args = parser.parse_args(argv)
    print(report(measure(args.rounds, args.iterations), "json dumps+loads, ms per round trip", "ms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
