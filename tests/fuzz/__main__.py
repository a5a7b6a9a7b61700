"""Run the fuzz targets under atheris: ``python -m tests.fuzz [--seconds N] [TARGET...]``.

Each target runs in a process of its own for ``--seconds``, with the seeds in
``tests/fuzz/corpus/<target>/`` and a working corpus kept in ``build/fuzz/<target>/corpus/``
(where libFuzzer adds every input that reached new code, so the next run starts from there).
An input that crashes or hangs ends libFuzzer's process: it is written to
``build/fuzz/<target>/artifacts/`` (crash-*, timeout-*, oom-*) and the run goes on in a new
process for the time left. The summary gives per target the inputs run, crashes, hangs, peak RSS
and libFuzzer's coverage: ``cov``, the code edges reached in instrumented modules
(``INSTRUMENTED``), and ``ft``, its finer features.

``python -m tests.fuzz child TARGET [libFuzzer flags] [corpus dirs]`` is one such process.
``python -m tests.fuzz seeds`` writes the seed corpus again (see ``seeds``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).resolve().parent / "corpus"
DICTS = Path(__file__).resolve().parent / "dicts"
WORK = ROOT / "build" / "fuzz"
NAMES = ("otlp_decode", "config", "profiles_append_split", "profiles_merge_split",
         "elf_file", "eh_frame", "gopclntab", "perf_map", "cpython_linetable", "cpython_debug_offsets")
# A target that keeps crashing at once is not run again more than this.
MAX_PROCESSES = 25
RSS_LIMIT_MB = 2048
# Packages whose coverage guides each target's fuzzer: those of the code the target drives, and
# the pure-Python parsers that code calls. atheris instruments whole top-level packages. (All of
# them for every target cost each run 8 s of start-up; these cost 1.5 to 5.)
INSTRUMENTED = {
    "otlp_decode": ["pycollector", "receivers", "google"],
    "config": ["pycollector", "receivers", "processors", "yaml"],  # (the components' config models)
    "profiles_append_split": ["pycollector", "processors"],
    "profiles_merge_split": ["pycollector", "processors"],
    "elf_file": ["receivers", "elftools"],
    "eh_frame": ["receivers"],
    "gopclntab": ["receivers"],
    "perf_map": ["receivers"],
    "cpython_linetable": ["receivers"],
    "cpython_debug_offsets": ["receivers"],
}


def child(name: str, flags: list[str]) -> None:
    import atheris

    with atheris.instrument_imports(include=INSTRUMENTED[name]):
        from tests.fuzz import targets
    atheris.Setup([sys.argv[0], *flags], targets.TARGETS[name].run)
    atheris.Fuzz()


@dataclasses.dataclass
class Result:
    target: str
    seconds: float = 0.0
    runs: int = 0
    crashes: int = 0
    hangs: int = 0
    ooms: int = 0
    peak_rss_mb: int = 0
    cov: int = 0
    ft: int = 0
    corpus: int = 0
    processes: int = 0
    artifacts: list[str] = dataclasses.field(default_factory=list)

    def failed(self) -> bool:
        return bool(self.crashes or self.hangs or self.ooms)


def dictionary_flags(name: str) -> list[str]:
    """libFuzzer's -dict for the target, when it has one: tokens it mutates inputs with."""
    path = DICTS / f"{name}.dict"
    return [f"-dict={path}"] if path.exists() else []


def command(name: str, flags: list[str], corpus: list[Path]) -> list[str]:
    return [sys.executable, "-m", "tests.fuzz", "child", name, *flags, *map(str, corpus)]


def child_env(tmp: Path) -> dict[str, str]:
    """Fixed hashing (same input, same path), temporary files under ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PYTHONHASHSEED": "0", "TMPDIR": str(tmp)}


def fuzz(name: str, seconds: float, seed: int | None) -> Result:
    from tests.fuzz.targets import TARGETS  # here, not at the top: children import it instrumented

    target, work = TARGETS[name], WORK / name
    corpus, artifacts = work / "corpus", work / "artifacts"
    for directory in (corpus, artifacts):
        directory.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(artifacts))
    result, started = Result(name), time.monotonic()
    log = (work / "fuzz.log").open("w")
    while (left := seconds - (time.monotonic() - started)) >= 1 and result.processes < MAX_PROCESSES:
        flags = [
            f"-max_total_time={int(left)}",
            f"-timeout={target.timeout}",
            f"-max_len={target.max_len}",
            f"-rss_limit_mb={RSS_LIMIT_MB}",
            f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1",
        ]
        flags += dictionary_flags(name)
        if seed is not None:
            flags.append(f"-seed={seed + result.processes}")
        process = subprocess.run(
            command(name, flags, [corpus, SEEDS / name]), cwd=ROOT, env=child_env(work / "tmp"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        log.write(process.stdout)
        result.processes += 1
        add_stats(result, process.stdout)
    log.close()
    result.seconds = time.monotonic() - started
    result.artifacts = sorted(set(os.listdir(artifacts)) - before)
    result.crashes = sum(1 for name in result.artifacts if name.startswith("crash-"))
    result.hangs = sum(1 for name in result.artifacts if name.startswith(("timeout-", "slow-unit-")))
    result.ooms = sum(1 for name in result.artifacts if name.startswith("oom-"))
    result.corpus = len(os.listdir(corpus)) + len(os.listdir(SEEDS / name))
    return result


def add_stats(result: Result, output: str) -> None:
    """Adds one libFuzzer process's final stats and its last coverage line to ``result``."""
    stats = dict(re.findall(r"^stat::(\w+):\s+(\d+)", output, re.M))
    result.runs += int(stats.get("number_of_executed_units", 0))
    result.peak_rss_mb = max(result.peak_rss_mb, int(stats.get("peak_rss_mb", 0)))
    for cov, ft in re.findall(r"\bcov: (\d+) ft: (\d+)", output):
        result.cov, result.ft = max(result.cov, int(cov)), max(result.ft, int(ft))


def report(results: list[Result]) -> str:
    header = f"{'target':<24}{'seconds':>8}{'inputs run':>12}{'crashes':>9}{'hangs':>7}{'ooms':>6}{'peak RSS':>10}{'cov':>7}{'ft':>7}{'corpus':>8}"
    lines = [header]
    for r in results:
        lines.append(
            f"{r.target:<24}{r.seconds:>8.0f}{r.runs:>12}{r.crashes:>9}{r.hangs:>7}{r.ooms:>6}{f'{r.peak_rss_mb} MB':>10}{r.cov:>7}{r.ft:>7}{r.corpus:>8}"
        )
        lines += [f"  {WORK / r.target / 'artifacts' / name}" for name in r.artifacts]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        child(argv[1], argv[2:])
        return 0
    if argv[:1] == ["seeds"]:
        from tests.fuzz import seeds

        seeds.write_all(SEEDS)
        return 0
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"{', '.join(NAMES)} (default: all)")
    parser.add_argument("--seconds", type=float, default=600, help="how long each target runs (default: 600)")
    parser.add_argument("--seed", type=int, help="libFuzzer's random seed (default: a new one each run)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.targets if name not in NAMES]
    if unknown:
        parser.error(f"unknown target {unknown[0]!r} (targets: {', '.join(NAMES)})")
    if importlib.util.find_spec("atheris") is None:
        parser.error("atheris is not installed: it is a test dependency (pip install -e '.[test]'), with wheels for Linux x86-64")
    results = []
    for name in args.targets or NAMES:
        print(f"fuzz: {name} for {args.seconds:.0f} s (log: {WORK / name / 'fuzz.log'})", file=sys.stderr, flush=True)
        results.append(fuzz(name, args.seconds, args.seed))
    print(report(results))
    return 1 if any(result.failed() for result in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
