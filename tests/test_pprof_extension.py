"""The pprof extension: go tool pprof reads the CPU profile of this process and finds the function a
thread is busy in, with the CPU time that thread used; idle threads are not in it. The thread dump,
the index page, 404s, the limits and the config errors."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pydantic
import pytest

from pycollector.component import StartError
from pycollector.config.errors import ConfigError
from pycollector.config.validate import build_plan
from pycollector.registry import Registry
from pycollector.testing import TestHost, assert_conformance, make_settings

from exporters.pprof.profile_proto import Profile
from extensions.pprof.extension import MAX_SECONDS
from extensions.pprof.factory import factory

GO = shutil.which("go")
needs_go = pytest.mark.skipif(GO is None, reason="go tool pprof is needed (Debian: golang-go)")


def spin_known_function(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def idle_known_function(stop: threading.Event) -> None:
    stop.wait()


@pytest.fixture
def threads():
    """A thread busy in spin_known_function and one waiting in idle_known_function."""
    stop = threading.Event()
    spinner = threading.Thread(target=spin_known_function, args=(stop,), name="pprof-test-spinner", daemon=True)
    idler = threading.Thread(target=idle_known_function, args=(stop,), name="pprof-test-idle", daemon=True)
    spinner.start()
    idler.start()
    yield spinner, idler
    stop.set()
    spinner.join()
    idler.join()


def start(**config):
    extension = factory.create(make_settings("extensions", "pprof"), factory.config_model(endpoint="127.0.0.1:0", **config), None)
    extension.start(TestHost())
    return extension


@pytest.fixture
def extension():
    extension = start()
    yield extension
    extension.shutdown()


def fetch(url: str, timeout: float = 30) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def thread_cpu_seconds(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "mins": 60.0, "hrs": 3600.0}


def seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)([a-zµ]*)", text).groups()
    return float(number) * _UNITS.get(unit, 1.0)


def pprof_top(source: str, tmp_path) -> tuple[str, list[tuple[str, str, float]]]:
    """``go tool pprof -top``'s output and its rows: (function, flat, flat share)."""
    env = dict(os.environ, PPROF_TMPDIR=str(tmp_path), HOME=str(tmp_path))
    result = subprocess.run([GO, "tool", "pprof", "-top", source], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    rows = []
    for line in result.stdout.splitlines():
        match = re.match(r"\s*(\S+)\s+([\d.]+)%\s+[\d.]+%\s+\S+\s+[\d.]+%\s+(.+)$", line)
        if match:
            rows.append((match.group(3).strip(), match.group(1), float(match.group(2)) / 100))
    return result.stdout, rows


def test_keeps_the_contract():
    assert_conformance(factory, "extensions", {"endpoint": "127.0.0.1:0"})


@needs_go
def test_go_tool_pprof_finds_the_busy_function_with_the_cpu_it_used(extension, threads, tmp_path):
    spinner, _ = threads
    before = thread_cpu_seconds(spinner)
    status, headers, body = fetch(extension.url + "profile?seconds=2")
    used = thread_cpu_seconds(spinner) - before
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    profile = Profile.FromString(gzip.decompress(body))
    strings = profile.string_table
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [("samples", "count"), ("cpu", "nanoseconds")]
    assert profile.period == 10_000_000 and (strings[profile.period_type.type], strings[profile.period_type.unit]) == ("cpu", "nanoseconds")
    path = tmp_path / "cpu.pb.gz"
    path.write_bytes(body)

    output, rows = pprof_top(str(path), tmp_path)
    print(output)
    print(f"spinner thread CPU during the request: {used:.3f}s")
    total = re.search(r"Duration: (\S+), Total samples = (\S+)", output)
    assert 1.9 <= seconds(total.group(1)) <= 3.0, output
    names = [name for name, _, _ in rows]
    assert "spin_known_function" in names[:3], output
    name, flat, share = rows[names.index("spin_known_function")]
    # Idle threads are not charged: the spinner is nearly all of it, and its time is what it used.
    assert share >= 0.8, output
    assert abs(seconds(flat) - used) <= 0.05 + 0.15 * used, (flat, used)
    assert "idle_known_function" not in output
    # Python frames with their file and line; the thread in a label.
    functions = {strings[f.name]: f for f in profile.function}
    assert strings[functions["spin_known_function"].filename] == __file__
    assert functions["spin_known_function"].start_line == spin_known_function.__code__.co_firstlineno
    labels = {strings[label.key]: strings[label.str] for sample in profile.sample for label in sample.label if label.str}
    assert labels.get("thread.name") == "pprof-test-spinner"


@needs_go
def test_go_tool_pprof_reads_the_url(extension, threads, tmp_path):
    output, rows = pprof_top(extension.url + "profile?seconds=1", tmp_path)
    assert "spin_known_function" in [name for name, _, _ in rows][:3], output


def test_thread_dump_is_the_goroutine_page(extension, threads):
    status, headers, body = fetch(extension.url + "goroutine?debug=2")
    text = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    idle_native_id = threads[1].native_id
    assert f'thread {idle_native_id} "pprof-test-idle" daemon:' in text
    entry = text[text.index(f"thread {idle_native_id} "):]
    assert "in idle_known_function" in entry.split("\n\n")[0]
    grouped = fetch(extension.url + "goroutine?debug=1")[2].decode()
    assert grouped.startswith("threads: total ") and '"pprof-test-spinner"' in grouped


@needs_go
def test_goroutine_profile_counts_threads_by_stack(extension, threads, tmp_path):
    status, headers, body = fetch(extension.url + "goroutine")
    assert status == 200 and headers["Content-Disposition"] == 'attachment; filename="goroutine"'
    path = tmp_path / "threads.pb.gz"
    path.write_bytes(body)
    output, rows = pprof_top(str(path), tmp_path)
    assert "Type: threads" in output
    assert ("idle_known_function" in output or "Event.wait" in output), output


def test_index_lists_the_profiles(extension):
    status, headers, body = fetch(extension.url)
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    for link in ("href='profile'", "href='goroutine?debug=1'", "href='cmdline'", 'href="goroutine?debug=2"'):
        assert link in page
    assert fetch(extension.url.rstrip("/"))[0] == 200
    assert fetch(extension.url + "cmdline")[2].split(b"\0")[0]


def test_unknown_paths_are_404(extension):
    assert fetch(extension.url + "heap")[:3:2] == (404, b"Unknown profile: heap\n")
    assert fetch(extension.url.removesuffix("/debug/pprof/") + "/elsewhere")[0] == 404


def test_profile_seconds_are_bounded(extension):
    status, _, body = fetch(extension.url + f"profile?seconds={MAX_SECONDS + 1}")
    assert status == 400 and f"at most {MAX_SECONDS}".encode() in body


def test_shutdown_ends_a_profile_in_progress(threads):
    extension = start()
    answers = []
    request = threading.Thread(target=lambda: answers.append(fetch(extension.url + "profile?seconds=60")))
    request.start()
    time.sleep(0.5)
    began = time.monotonic()
    extension.shutdown()
    request.join(10)
    assert time.monotonic() - began < 5 and answers and answers[0][0] == 200
    assert Profile.FromString(gzip.decompress(answers[0][2])).sample


@needs_go
def test_save_to_file_writes_the_whole_run_at_shutdown(threads, tmp_path):
    path = tmp_path / "run.pprof"
    extension = start(save_to_file=str(path))
    time.sleep(1)
    extension.shutdown()
    output, rows = pprof_top(str(path), tmp_path)
    assert "spin_known_function" in [name for name, _, _ in rows][:3], output


def test_save_to_file_that_cannot_be_created_stops_the_start(tmp_path):
    extension = factory.create(make_settings("extensions", "pprof"),
                               factory.config_model(endpoint="127.0.0.1:0", save_to_file=str(tmp_path / "missing" / "cpu.pprof")), None)
    with pytest.raises(StartError, match=r"^save_to_file: cannot create .*missing/cpu.pprof"):
        extension.start(TestHost())
    extension.shutdown()


def test_bad_endpoint_is_a_config_error_naming_the_key():
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": None}}},
        "exporters": {"debug": {}},
        "extensions": {"pprof": {"endpoint": "localhost"}},
        "service": {"extensions": ["pprof"], "pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["debug"]}}},
    }
    with pytest.raises(ConfigError) as caught:
        build_plan(config, Registry())
    assert "extensions::pprof::endpoint" in str(caught.value) and "host:port" in str(caught.value)


def test_go_keys_are_accepted_where_they_act_and_refused_by_name_where_they_would_not():
    config = factory.config_model(endpoint="127.0.0.1:0", block_profile_fraction=0, mutex_profile_fraction=-1, save_to_file="")
    assert factory.config_model().endpoint == "localhost:1777"
    extension = factory.create(make_settings("extensions", "pprof"), config, None)
    extension.start(TestHost())
    extension.shutdown()
    for key in ("block_profile_fraction", "mutex_profile_fraction"):
        with pytest.raises(pydantic.ValidationError, match="not supported by pycollector: CPython has no block or mutex profiles"):
            factory.config_model.model_validate({key: 5})
