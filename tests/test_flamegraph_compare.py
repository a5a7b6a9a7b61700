"""Two profiles compared function by function (exporters/flamegraph/compare.py), checked against
`go tool pprof -top -normalize -diff_base` on files go's pprof wrote itself."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pycollector.pdata import ProfilesBuilder

from exporters.flamegraph.compare import Side, compare, kept_apart, read_stacks
from exporters.pprof.convert import to_pprof
from tests.conftest import build_go_program

PERIOD_NS = 10_000_000
UNIT_NS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9, "min": 60e9, "h": 3600e9}


def profile(shares: dict[str, int], sample_type: tuple[str, str] = ("samples", "count")) -> bytes:
    """A pprof file: main -> each function, that many samples; and main itself 10."""
    b = ProfilesBuilder()
    scope = b.scope_profiles(b.resource_profiles({"process.pid": 1, "process.executable.name": "app"}))
    prof = b.profile(scope, sample_type=sample_type, period_type=("cpu", "nanoseconds"), period=PERIOD_NS)
    main = b.location(lines=[(b.function("main"), 0, 0)])
    for function, samples in {**shares, "main": 10}.items():
        stack = [main] if function == "main" else [b.location(lines=[(b.function(function), 0, 0)]), main]
        b.sample(prof, b.stack(stack), [samples])
    (pprof,) = to_pprof(b.data, merged=True)
    return gzip.compress(pprof.profile.SerializeToString())


def go_top_diff(base, after) -> dict[str, tuple[float, float]]:
    """function -> (flat change in ns, cum change as a signed share) by go tool pprof -top
    -normalize -diff_base: "  -459.81ms 45.98% 45.98%  -459.81ms 45.98%  render"."""
    top = subprocess.run(["go", "tool", "pprof", "-top", "-normalize", "-diff_base", str(base), str(after)],
                         capture_output=True, text=True, check=True).stdout
    out = {}
    for line in top.splitlines():
        match = re.match(r"\s*(-?[\d.]+)(ns|us|ms|s|min|h)?\s+[\d.]+%\s+\S+%\s+(-?)[\d.]+\w*\s+([\d.]+)%\s+(\S+)$", line)
        if match:
            flat_ns = float(match.group(1)) * UNIT_NS[match.group(2) or "ns"]
            out[match.group(5)] = (flat_ns, (-1 if match.group(3) else 1) * float(match.group(4)) / 100)
    return out


def native(*names: str) -> tuple:
    return tuple((name, "native") for name in names)


def test_shares_are_normalized_and_a_change_within_the_noise_is_flagged():
    base = Side.of([(native("main", "hot"), 20), (native("main", "cold"), 80)])
    after = Side.of([(native("main", "hot"), 600), (native("main", "cold"), 400)])  # ten times the samples
    changes = compare(base, after)
    assert changes[0].function == "hot" and changes[0].self_change == pytest.approx(0.4)
    assert changes[-1].function == "cold" and changes[-1].self_change == pytest.approx(-0.4)
    assert changes[0].base_total == pytest.approx(0.2) and not changes[0].noise
    small = compare(Side.of([(native("a"), 50), (native("b"), 50)]), Side.of([(native("a"), 52), (native("b"), 48)]))
    assert all(change.noise for change in small)


def test_namesakes_of_two_frame_types_are_two_rows_and_other_names_are_left_alone():
    """The kernel's memcpy (under write) lost what libc's (under encode) gained: one row keyed by
    the name alone would show no change at all."""
    kernel_copy = (("main", "native"), ("write", "native"), ("memcpy", "kernel"))
    libc_copy = (("main", "native"), ("encode", "native"), ("memcpy", "native"))
    sides = kept_apart([(kernel_copy, 50), (libc_copy, 50)], [(kernel_copy, 20), (libc_copy, 80)])
    changes = {change.function: change for change in compare(*(Side.of(stacks) for stacks in sides))}
    assert changes["memcpy [native]"].self_change == pytest.approx(0.3) and changes["memcpy [kernel]"].self_change == pytest.approx(-0.3)
    assert "memcpy" not in changes and {"main", "write", "encode"} <= set(changes)
    unshared = kept_apart([(libc_copy, 1)], [(native("main", "memcpy"), 1)])
    assert unshared == [[(libc_copy, 1)], [(native("main", "memcpy"), 1)]]  # one type: the name as it is


@pytest.mark.skipif(shutil.which("go") is None, reason="go tool pprof is not installed (scripts/setup.sh installs golang-go)")
def test_the_top_changes_are_go_tool_pprofs(tmp_path):
    ours = {"base": profile({"parse": 20, "render": 60, "send": 10}), "after": profile({"parse": 70, "render": 15, "send": 12})}
    written = {}
    for name, data in ours.items():
        (tmp_path / f"ours-{name}.pb.gz").write_bytes(data)
        written[name] = tmp_path / f"go-{name}.pb.gz"
        with open(written[name], "wb") as out:  # written by go's pprof, not by us
            subprocess.run(["go", "tool", "pprof", "-proto", str(tmp_path / f"ours-{name}.pb.gz")], stdout=out, check=True, capture_output=False,
                           stderr=subprocess.DEVNULL)
    sides = [Side.of(read_stacks(written[name])[0]) for name in ("base", "after")]
    changes = compare(*sides)
    flat = {function: flat_ns for function, (flat_ns, _) in go_top_diff(written["base"], written["after"]).items()}
    by_go = sorted(flat, key=lambda function: -flat[function])
    assert changes[0].function == by_go[0] == "parse", (flat, changes[:3])
    assert changes[-1].function == by_go[-1] == "render", (flat, changes[-3:])


def test_pycollector_diff_prints_the_top_changes_each_way(tmp_path, cli):
    base, after = tmp_path / "base.pb.gz", tmp_path / "after.pb.gz"
    base.write_bytes(profile({"parse": 20, "render": 60, "send": 10}))
    after.write_bytes(profile({"parse": 70, "render": 15, "send": 12}))
    result = cli("diff", str(base), str(after))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    more, less = lines.index("costs more"), lines.index("costs less")
    assert lines[more + 1].split()[-1] == "parse" and lines[more + 1].split()[0] == "+45.4%", result.stdout
    assert lines[less + 1].split()[-1] == "render" and lines[less + 1].split()[0] == "-46.0%", result.stdout
    assert lines[0].startswith("base: 100") and "after: 107" in lines[0]
    missing = cli("diff", str(base), str(tmp_path / "nowhere.pb.gz"))
    assert missing.returncode == 1 and "nowhere.pb.gz" in missing.stderr


@pytest.mark.parametrize("encoding", ["json", "proto"])
def test_otlp_files_the_file_exporter_writes_are_read_and_filtered_by_process(tmp_path, encoding):
    from exporters.file.encoding import frame

    b = ProfilesBuilder()
    for pid, name, function in ((1, "app", "parse"), (2, "db", "query")):
        scope = b.scope_profiles(b.resource_profiles({"process.pid": pid, "process.executable.name": name}))
        prof = b.profile(scope, sample_type=("samples", "count"), period_type=("cpu", "nanoseconds"), period=PERIOD_NS)
        b.sample(prof, b.stack([b.location(lines=[(b.function(function), 0, 0)]), b.location(lines=[(b.function("main"), 0, 0)])]), [pid * 10])
    path = tmp_path / f"profiles.{encoding}"
    path.write_bytes(frame(b.data, encoding) * 2)  # two messages, as two exports write
    stacks, value_type, counts = read_stacks(path, process="db")
    assert (value_type, counts) == (("samples", "count"), True)
    assert stacks == [((("main", ""), ("query", "")), 20)] * 2  # (no frame type given)
    with pytest.raises(ValueError, match="no samples of process 'web'"):
        read_stacks(path, process="web")


def versions_file(tmp_path, encoding="json"):
    """One OTLP file holding two versions of a Python service that ran in turn: version 1 spends
    20% in `hot`, version 2 60% (the rest in `cold`), each Python frame ending in the interpreter's C code."""
    from exporters.file.encoding import frame

    path = tmp_path / f"versions.{encoding}"
    with open(path, "wb") as out:
        for number, pid, hot, cold in (("1", 10, 20, 80), ("2", 20, 60, 40)):
            b = ProfilesBuilder()
            scope = b.scope_profiles(b.resource_profiles({"process.pid": pid, "process.executable.name": "python3.11",
                                                          "service.name": "shop", "service.version": number}))
            prof = b.profile(scope, sample_type=("samples", "count"), period_type=("cpu", "nanoseconds"), period=PERIOD_NS)

            def python(function, line):
                return b.location(lines=[(b.function(function, filename="/srv/app.py"), line, 0)], attributes={"profile.frame.type": "cpython"})

            evaluate = b.location(lines=[(b.function("_PyEval_EvalFrameDefault"), 0, 0)], attributes={"profile.frame.type": "native"})
            for function, samples in (("hot", hot), ("cold", cold)):
                for line in (3, 4):  # one function on two lines is one row
                    b.sample(prof, b.stack([evaluate, python(function, line), python("main", 9)]), [samples // 2])
            out.write(frame(b.data, encoding))
    return path


def test_a_python_functions_self_is_its_innermost_python_frame_and_sides_are_chosen_by_resource(tmp_path, cli):
    path = versions_file(tmp_path)
    result = cli("diff", str(path), str(path), "--base-where", "service.version=1", "--after-where", "service.version=2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    more, less = lines.index("costs more"), lines.index("costs less")
    # Not _PyEval_EvalFrameDefault: the language's function, in its file, one row for both lines.
    assert lines[more + 1].split()[0] == "+40.0%" and lines[more + 1].endswith("hot (app.py)"), result.stdout
    assert lines[less + 1].split()[0] == "-40.0%" and lines[less + 1].endswith("cold (app.py)"), result.stdout
    assert lines[0].startswith("base: 100 samples") and "after: 100 samples" in lines[0]
    nothing = cli("diff", str(path), str(path), "--where", "service.version=3")
    assert nothing.returncode == 1 and "no samples with service.version=3" in nothing.stderr
    bad = cli("diff", str(path), str(path), "--where", "service.version")
    assert bad.returncode == 2 and "expected KEY=VALUE" in bad.stderr


def test_diff_writes_a_page_that_opens_on_the_comparison(tmp_path, cli):
    from tests.test_flamegraph_browser import CHROMIUM, chromium
    from tests.test_flamegraph_diff import DiffTable

    from exporters.flamegraph.page import missing_vendor_files

    if CHROMIUM is None or missing_vendor_files():
        pytest.skip("chromium or the flame graph renderer is not installed (scripts/setup.sh)")
    path = versions_file(tmp_path, "proto")
    page = tmp_path / "diff.html"
    result = cli("diff", str(path), str(path), "--base-where", "service.version=1", "--after-where", "service.version=2", "-o", str(page))
    assert result.returncode == 0 and f"wrote {page}" in result.stdout, result.stderr
    dom, console = chromium(page.as_uri(), tmp_path, "--dump-dom")
    assert console == [], console
    table = DiffTable(dom)
    assert table.more[0][0] == "hot (app.py)" and table.more[0][1] == pytest.approx(0.4), table.more
    assert table.less[0][0] == "cold (app.py)" and "base: versions.proto service.version=1" in table.note, table.note


GROW_SHRINK = Path(__file__).parent / "testdata" / "diff" / "grow_shrink.go"


@pytest.fixture(scope="module")
def go_versions(tmp_path_factory):
    """Two CPU profiles go's runtime/pprof wrote itself: version 1 calls spin through growMe 20%
    of the time, version 2 60% (shrinkMe the rest); spin holds all the self time on both sides."""
    if shutil.which("go") is None:
        pytest.skip("go is not installed (scripts/setup.sh installs golang-go)")
    work = tmp_path_factory.mktemp("grow_shrink")
    program = build_go_program(GROW_SHRINK, work / "grow_shrink")
    versions = {}
    for name, share in (("base", 20), ("after", 60)):
        versions[name] = work / f"{name}.pb.gz"
        subprocess.run([str(program), str(share), "2", str(versions[name])], check=True, timeout=60)
    return versions


def listed(stdout: str) -> tuple[list[list[str]], list[list[str]]]:
    """pycollector diff's rows under "costs more" and under "costs less", split into words."""
    lines = stdout.splitlines()
    more, less = lines.index("costs more"), lines.index("costs less")
    return [line.split() for line in lines[more + 1:less]], [line.split() for line in lines[less + 1:]]


def test_a_caller_that_now_calls_the_hot_helper_more_is_listed_by_its_total(go_versions, cli):
    """The helper's self share does not move; the callers' totals do, as go tool pprof's cum says."""
    by_go = {function: cum for function, (_, cum) in go_top_diff(go_versions["base"], go_versions["after"]).items()}
    result = cli("diff", str(go_versions["base"]), str(go_versions["after"]))
    assert result.returncode == 0, result.stderr
    more, less = listed(result.stdout)
    assert more and less, result.stdout
    assert (more[0][-1], more[0][1]) == ("main.growMe", "total"), result.stdout
    assert (less[0][-1], less[0][1]) == ("main.shrinkMe", "total"), result.stdout
    for row, function in ((more[0], "main.growMe"), (less[0], "main.shrinkMe")):
        assert abs(float(row[0].rstrip("%~")) / 100 - by_go[function]) <= 0.02, (result.stdout, by_go)
    assert by_go["main.growMe"] > 0.2 and by_go["main.shrinkMe"] < -0.2, by_go


def test_the_pages_table_lists_the_same_rows(go_versions, tmp_path, cli):
    from tests.test_flamegraph_browser import CHROMIUM, chromium
    from tests.test_flamegraph_diff import DiffTable

    from exporters.flamegraph.page import missing_vendor_files

    if CHROMIUM is None or missing_vendor_files():
        pytest.skip("chromium or the flame graph renderer is not installed (scripts/setup.sh)")
    page = tmp_path / "diff.html"
    result = cli("diff", str(go_versions["base"]), str(go_versions["after"]), "-o", str(page))
    assert result.returncode == 0, result.stderr
    more, less = listed(result.stdout.rsplit("\nwrote ", 1)[0])
    dom, console = chromium(page.as_uri(), tmp_path, "--dump-dom")
    assert console == [], console
    screenshot = tmp_path / "go-versions-diff.png"
    _, console = chromium(page.as_uri(), tmp_path, f"--screenshot={screenshot}")
    assert console == [] and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")
    table = DiffTable(dom)
    for ours, theirs in ((more, table.more), (less, table.less)):
        assert [row[-1] for row in ours] == [function for function, _ in theirs][:len(ours)], (result.stdout, theirs)
        assert [float(row[0].rstrip("%~")) for row in ours] == pytest.approx([100 * change for _, change in theirs][:len(ours)], abs=0.051)
    assert table.by["main.growMe"] == table.by["main.shrinkMe"] == "total"


def test_two_profiles_of_different_types_are_refused_unless_the_type_is_named(go_versions, tmp_path, cli):
    waits = tmp_path / "off_cpu.pb.gz"
    waits.write_bytes(profile({"parse": 20_000_000}, ("off_cpu", "nanoseconds")))
    refused = cli("diff", str(waits), str(go_versions["after"]))
    assert refused.returncode == 1 and "say which type to compare with --type" in refused.stderr, refused.stderr
    assert "off_cpu/nanoseconds" in refused.stderr and "cpu/nanoseconds" in refused.stderr, refused.stderr
    missing = cli("diff", str(waits), str(go_versions["after"]), "--type", "cpu")
    assert missing.returncode == 1 and "no sample type 'cpu'" in missing.stderr, missing.stderr
    cpu = tmp_path / "cpu.pb.gz"
    cpu.write_bytes(profile({"parse": 20}))
    same = cli("diff", str(cpu), str(go_versions["after"]))
    assert same.returncode == 0 and "type: cpu" in same.stdout, same.stderr


def test_a_pprof_files_python_functions_are_their_own_self_and_apart_from_native_namesakes(tmp_path, cli):
    """A pprof file says no frame types: a function in a .py file is Python's, listed by its file,
    its samples' self time its own and not the interpreter's C function's."""
    paths = []
    for number, hot in (("1", 20), ("2", 60)):
        b = ProfilesBuilder()
        scope = b.scope_profiles(b.resource_profiles({"process.pid": 1, "process.executable.name": "python3.11"}))
        prof = b.profile(scope, sample_type=("samples", "count"), period_type=("cpu", "nanoseconds"), period=PERIOD_NS)
        evaluate = b.location(lines=[(b.function("_PyEval_EvalFrameDefault"), 0, 0)])
        main = b.location(lines=[(b.function("main", filename="/srv/app.py"), 9, 0)])
        for function, samples in (("hot", hot), ("cold", 100 - hot)):
            b.sample(prof, b.stack([evaluate, b.location(lines=[(b.function(function, filename="/srv/app.py"), 3, 0)]), main]), [samples])
        b.sample(prof, b.stack([b.location(lines=[(b.function("hot"), 0, 0)]), main]), [10])  # a native namesake
        (pprof,) = to_pprof(b.data, merged=True)
        paths.append(tmp_path / f"v{number}.pb.gz")
        paths[-1].write_bytes(gzip.compress(pprof.profile.SerializeToString()))
    result = cli("diff", *map(str, paths))
    assert result.returncode == 0, result.stderr
    more, less = listed(result.stdout)
    assert " ".join(more[0][3:]).endswith("hot (app.py)") and more[0][1] == "self", result.stdout
    assert " ".join(less[0][3:]).endswith("cold (app.py)"), result.stdout
    assert "_PyEval_EvalFrameDefault" not in result.stdout, result.stdout

