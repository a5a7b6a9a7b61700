"""The symbolizer's debuginfod client against real servers on loopback: elfutils' debuginfod over
the debug files the tests build, and servers that misbehave. Stripped programs run as real
processes; the attacks run as user nobody."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import structlog

from receivers.profiling.processes.table import ProcessTable
from receivers.profiling.symbols.debuginfod import DebuginfodClient
from receivers.profiling.symbols.symbolizer import Symbolizer
from tests.debuginfod_servers import Debuginfod, Misbehaving, endless, free_port, said_four_gib, serving, silent
from tests.test_profiling_symbolizer import MINI_C, Running, build_id_of, compile_c, need

NOBODY = 65534


def client(cache: Path, *urls: str, **settings) -> DebuginfodClient:
    options = dict(cache_bytes=64 << 20, max_file_bytes=16 << 20, timeout_s=5.0, fetch_timeout_s=30.0, negative_expiry_s=600.0,
                   fetches_per_minute=60, fetches_per_process_per_minute=20)
    options.update(settings)
    return DebuginfodClient(list(urls), cache_dir=str(cache), logger=structlog.get_logger("test"), **options)


def stripped(directory: Path, name: str = "prog", source: str = MINI_C) -> tuple[Path, Path, str]:
    """A program whose static function only its debug file names: (the stripped program, its
    debug file, its build id)."""
    need("objcopy")
    directory.mkdir(parents=True, exist_ok=True)
    exe = compile_c(directory, name, source, "-g", "-rdynamic")
    debug = directory / f"{name}.debug"
    subprocess.run(["objcopy", "--only-keep-debug", exe, debug], check=True)
    subprocess.run(["strip", "--strip-all", exe], check=True)
    return exe, debug, build_id_of(exe)


@contextlib.contextmanager
def symbolizing(exe: Path, table: ProcessTable, cache: Path, url: str, **settings):
    """``exe`` running, and a symbolizer whose debuginfod client asks ``url``: (the run, the
    client, the symbolizer)."""
    run = Running(exe, lines=2)
    try:
        table.on_new_process(run.pid, run.pid, exe.name)
        fetching = client(cache, url, **settings)
        yield run, fetching, Symbolizer(table, debug_dirs=[], debuginfod=fetching)
    finally:
        run.stop()


def names(symbolizer: Symbolizer, run: Running) -> list[str | None]:
    """The names of the program's static and exported functions (each looked up as a caller's)."""
    return [frame.name for frame in symbolizer.symbolize_user(run.pid, [run.addrs[0] + 1, run.addrs[1] + 1])]


def eventually(condition, timeout: float = 30.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


@pytest.fixture
def table():
    return ProcessTable()


@pytest.fixture
def server_files(tmp_path):
    """The directory a debuginfod server serves, with one debug file it has to index first."""
    directory = tmp_path / "server"
    _, debug, build_id = stripped(tmp_path / "other", "other")
    directory.mkdir()
    shutil.copy(debug, directory / "other.debug")
    return directory, build_id


def test_a_stripped_programs_functions_are_named_once_its_debug_file_is_fetched_and_after_a_restart(tmp_path, table, server_files):
    """Named from .dynsym alone at first (the static function has no name there) while the fetch
    runs on the client's thread; named from the debug file once it is on disk, which a restart
    uses without asking the server again."""
    served, _ = server_files
    exe, debug, build_id = stripped(tmp_path / "program")
    shutil.copy(debug, served / "prog.debug")
    server = Debuginfod(served, serving=[build_id])
    try:
        with symbolizing(exe, table, tmp_path / "cache", server.url) as (run, fetching, symbolizer):
            assert names(symbolizer, run) == [None, "exported_function"]
            assert eventually(lambda: names(symbolizer, run) == ["static_function", "exported_function"]), (fetching.stats, names(symbolizer, run))
            assert (fetching.stats["requests"], fetching.stats["fetched"]) == (1, 1), fetching.stats
            assert fetching.stats["fetched_bytes"] == debug.stat().st_size == (tmp_path / "cache" / f"{build_id}.debug").stat().st_size
            server.stop()
            again = client(tmp_path / "cache", server.url)
            assert names(Symbolizer(table, debug_dirs=[], debuginfod=again), run) == ["static_function", "exported_function"]
            assert again.stats["requests"] == 0 and again.stats["cache_hits"] == 1, again.stats
    finally:
        server.stop()


def test_a_build_id_no_server_knows_is_asked_for_once_and_then_answered_from_the_negative_cache(tmp_path, table, server_files):
    served, other = server_files
    exe, _, build_id = stripped(tmp_path / "program")
    server = Debuginfod(served, serving=[other])
    try:
        with symbolizing(exe, table, tmp_path / "cache", server.url) as (run, fetching, symbolizer):
            assert names(symbolizer, run) == [None, "exported_function"]
            assert eventually(lambda: fetching.stats["not_found"] == 1 and not fetching.awaits(build_id)), fetching.stats
            for _ in range(3):  # (a file awaiting its debug file is looked at again each second)
                time.sleep(1.1)
                assert names(symbolizer, run) == [None, "exported_function"]
            assert fetching.stats["requests"] == 1 and fetching.stats["negative_cache_hits"] >= 2, fetching.stats
            assert list((tmp_path / "cache").iterdir()) == []
    finally:
        server.stop()


@pytest.mark.parametrize("failure", ["stopped", "silent"])
def test_a_server_that_is_gone_or_never_answers_costs_no_lookup_its_wait_and_is_not_asked_again(tmp_path, table, failure):
    """A port nobody listens on, or a socket that accepts and never answers: the lookups return at
    once while the fetch waits (4 s, its timeout, for the silent one); the failure is
    counted, the build id kept in the negative cache, and the server not asked for another
    program's file meanwhile."""
    silent_server = Misbehaving(silent) if failure == "silent" else None
    url = silent_server.url if silent_server else f"http://127.0.0.1:{free_port()}"
    exe, _, build_id = stripped(tmp_path / "program")
    second = Running(stripped(tmp_path / "second", "second")[0], lines=2)
    try:
        table.on_new_process(second.pid, second.pid, "second")
        with symbolizing(exe, table, tmp_path / "cache", url, timeout_s=4.0) as (run, fetching, symbolizer):
            started = time.monotonic()
            assert names(symbolizer, run) == [None, "exported_function"]
            took = time.monotonic() - started
            if silent_server:
                # (the fetch waits its 4 s: not the lookup, which takes milliseconds; half the
                # timeout leaves a loaded host its room, where 0.9 s of one second did not)
                assert fetching.awaits(build_id) and took < 2.0, took
            assert eventually(lambda: fetching.stats["failures"] == 1 and not fetching.awaits(build_id)), fetching.stats
            assert names(symbolizer, second) == [None, "exported_function"]
            time.sleep(1.1)
            assert names(symbolizer, run) == [None, "exported_function"]
            assert fetching.stats["requests"] == 1 and fetching.stats["servers_down"] >= 1 and fetching.stats["negative_cache_hits"] >= 1, fetching.stats
            if silent_server:
                assert silent_server.connections == 1
    finally:
        second.stop()
        if silent_server:
            silent_server.stop()


@pytest.mark.parametrize("answer", ["endless", "four GiB said"])
def test_an_answer_without_end_is_cut_at_the_size_cap_and_nothing_is_kept(tmp_path, table, answer):
    server = Misbehaving(endless if answer == "endless" else said_four_gib)
    exe, _, build_id = stripped(tmp_path / "program")
    try:
        with symbolizing(exe, table, tmp_path / "cache", server.url, max_file_bytes=4 << 20) as (run, fetching, symbolizer):
            assert names(symbolizer, run) == [None, "exported_function"]
            assert eventually(lambda: fetching.stats["too_large"] == 1 and not fetching.awaits(build_id)), fetching.stats
            assert fetching.stats["fetched"] == 0 and list((tmp_path / "cache").iterdir()) == []
            # What the server got out before the client hung up: the cap and what sockets buffer.
            assert server.sent < 64 << 20, server.sent
            time.sleep(1.1)
            assert names(symbolizer, run) == [None, "exported_function"]
            assert fetching.stats["requests"] == 1
    finally:
        server.stop()


@pytest.mark.parametrize("answer", ["other build id", "other machine", "not ELF"])
def test_an_answer_that_is_not_the_file_asked_for_names_nothing_and_is_not_kept(tmp_path, table, answer):
    """The server sends a valid ELF debug file of another build, one of this build for another
    machine (its e_machine changed), or bytes that are not ELF: rejected, counted, deleted."""
    exe, debug, build_id = stripped(tmp_path / "program")
    _, other_debug, _ = stripped(tmp_path / "other", "other")
    content = {"other build id": other_debug.read_bytes(), "not ELF": os.urandom(100_000),
               "other machine": debug.read_bytes()[:18] + (183).to_bytes(2, "little") + debug.read_bytes()[20:]}[answer]  # (EM_AARCH64)
    reason = {"other build id": "rejected_other_build_id", "other machine": "rejected_other_machine", "not ELF": "rejected_not_elf"}[answer]
    server = Misbehaving(serving(content))
    try:
        with symbolizing(exe, table, tmp_path / "cache", server.url) as (run, fetching, symbolizer):
            assert names(symbolizer, run) == [None, "exported_function"]
            assert eventually(lambda: fetching.stats[reason] == 1 and not fetching.awaits(build_id)), fetching.stats
            time.sleep(1.1)
            assert names(symbolizer, run) == [None, "exported_function"]
            assert fetching.stats["fetched"] == 0 and list((tmp_path / "cache").iterdir()) == []
    finally:
        server.stop()


def test_one_process_showing_many_build_ids_is_held_to_its_allowance(tmp_path, server_files):
    """What the client is asked for one process past its allowance is refused, counted, and
    asked for again later, when the allowance has grown back."""
    served, other = server_files
    server = Debuginfod(served, serving=[other])
    try:
        fetching = client(tmp_path / "cache", server.url, fetches_per_process_per_minute=5)
        forged = [f"{i:040x}" for i in range(1, 31)]
        for build_id in forged:
            assert fetching.debug_file(build_id, "EM_X86_64", ("attacker", 1)) is None
        assert fetching.debug_file("ab" * 20, "EM_X86_64", ("another process", 1)) is None
        assert eventually(lambda: fetching.stats["not_found"] == 6), fetching.stats
        assert fetching.stats["requests"] == 6 and fetching.stats["rate_limited"] == 25, fetching.stats
        assert fetching.debug_file("../../etc/passwd", "EM_X86_64", ("attacker", 1)) is None
        assert fetching.stats["invalid_build_ids"] == 1 and fetching.stats["requests"] == 6
    finally:
        server.stop()


def forged_copies(program: Path, build_id: str, directory: Path, count: int) -> list[Path]:
    """``count`` copies of ``program``, each with a build id of its own (its note's bytes
    rewritten), readable by everyone."""
    content = program.read_bytes()
    at = content.index(bytes.fromhex(build_id))
    copies = []
    for i in range(count):
        copy = directory / f"forged-{i}"
        copy.write_bytes(content[:at] + (i + 1).to_bytes(20, "big") + content[at + 20:])
        copy.chmod(0o755)
        copies.append(copy)
    return copies


@pytest.mark.alone
def test_a_thousand_processes_each_with_a_forged_build_id_cost_the_hosts_allowance_and_name_nothing(table, server_files):
    """User nobody runs 1,000 programs, each with a build id of its own that no server knows: the
    host's allowance (30 a minute here) is all they get, the rest counted; nothing is named
    from a file that is not theirs, and each asked-for build id is asked for once."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the attack as another user")
    served, other = server_files
    server = Debuginfod(served, serving=[other])
    directory = Path(tempfile.mkdtemp(prefix="pycollector-debuginfod-", dir="/var/tmp"))
    directory.chmod(0o755)
    runs = []
    try:
        program, _, build_id = stripped(directory / "build")
        copies = forged_copies(program, build_id, directory, 1000)
        for copy in copies:
            runs.append(Running(copy, lines=2, prefix=("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")))
            table.on_new_process(runs[-1].pid, runs[-1].pid, copy.name)
        fetching = client(Path(directory) / "cache", server.url, fetches_per_minute=30)
        symbolizer = Symbolizer(table, debug_dirs=[], debuginfod=fetching)
        started = time.monotonic()
        assert {tuple(names(symbolizer, run)) for run in runs} == {(None, "exported_function")}
        minutes = (time.monotonic() - started) / 60
        assert eventually(lambda: not any(fetching.awaits(f"{i + 1:040x}") for i in range(1000))), fetching.stats
        allowed = 30 + 30 * minutes + 1
        print(fetching.stats, f"{minutes * 60:.1f} s")
        assert fetching.stats["requests"] <= allowed and fetching.stats["requests"] == fetching.stats["not_found"], fetching.stats
        assert fetching.stats["requests"] + fetching.stats["rate_limited"] + fetching.stats["queue_full"] >= 1000 - 1, fetching.stats
        assert fetching.stats["fetched"] == 0 and not list((directory / "cache").iterdir())
    finally:
        for run in runs:
            run.proc.kill()
            run.proc.wait()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_the_cache_keeps_the_most_recently_used_within_its_budget(tmp_path, table, server_files):
    """Three debug files of about 20 KB in a budget of 50 KB: the least recently used goes."""
    served, other = server_files
    programs = [stripped(tmp_path / f"p{i}", f"p{i}") for i in range(3)]
    for exe, debug, _ in programs:
        shutil.copy(debug, served / debug.name)
    server = Debuginfod(served, serving=[build_id for _, _, build_id in programs])
    budget = sum(debug.stat().st_size for _, debug, _ in programs[:2]) + 100
    try:
        fetching = client(tmp_path / "cache", server.url, cache_bytes=budget)
        for _, _, build_id in programs:
            fetching.debug_file(build_id, "EM_X86_64", ("test", 1))
            assert eventually(lambda: fetching.debug_file(build_id, "EM_X86_64", ("test", 1)) is not None)
        kept = sorted(path.name for path in (tmp_path / "cache").iterdir())
        assert kept == sorted(f"{build_id}.debug" for _, _, build_id in programs[1:]), kept
        assert fetching.stats["evicted"] == 1 and fetching.stats["fetched"] == 3
    finally:
        server.stop()


def test_a_cache_directory_others_can_write_is_not_used(tmp_path):
    """Whoever can write the cache names the frames of every file whose build id they pick."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    fetching = client(shared, "http://127.0.0.1:9")
    assert not fetching.usable and fetching.debug_file("ab" * 20, "EM_X86_64", ("test", 1)) is None
    assert fetching.stats["requests"] == 0
