import pytest

from pycollector.config import ConfigError, load
from pycollector.config.types import format_duration, parse_duration


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_files_deep_merge_in_order_and_lists_are_replaced(tmp_path):
    first = write(tmp_path, "a.yaml", "exporters:\n  debug: {verbosity: basic, sampling_initial: 5}\nservice:\n  pipelines:\n    profiles: {receivers: [a, b]}\n")
    second = write(tmp_path, "b.yaml", "exporters:\n  debug: {verbosity: detailed}\nservice:\n  pipelines:\n    profiles: {receivers: [c]}\n")
    config = load([first, second])
    assert config["exporters"]["debug"] == {"verbosity": "detailed", "sampling_initial": 5}
    assert config["service"]["pipelines"]["profiles"]["receivers"] == ["c"]


@pytest.mark.parametrize("assignment", ["exporters.debug.verbosity=normal", "exporters::debug::verbosity=normal"])
def test_set_overrides_after_files_with_either_delimiter(tmp_path, assignment):
    path = write(tmp_path, "a.yaml", "exporters:\n  debug: {verbosity: basic}\n")
    assert load([path], [assignment])["exporters"]["debug"]["verbosity"] == "normal"


def test_set_value_is_yaml_typed_and_creates_missing_maps(tmp_path):
    path = write(tmp_path, "a.yaml", "{}")
    config = load([path], ["service::telemetry::metrics::level=none", "exporters::debug::sampling_initial=7"])
    assert config["exporters"]["debug"]["sampling_initial"] == 7
    assert config["service"]["telemetry"]["metrics"]["level"] == "none"


def test_environment_and_file_references(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    path = write(
        tmp_path,
        "a.yaml",
        "a: ${env:HOST}\nb: ${env:MISSING:-fallback}\nc: ${PORT}\nd: 'http://${env:HOST}:${PORT}/x'\n"
        f"e: ${{file:{secret}}}\nf: $${{env:HOST}}\ng: cost $$5\nh: ${{env:EMPTY:-dflt}}\n",
    )
    config = load([path], env={"HOST": "collector", "PORT": "4317", "EMPTY": ""})
    assert config == {
        "a": "collector",
        "b": "fallback",
        "c": 4317,  # a value that is exactly one reference takes the YAML type of what it refers to
        "d": "http://collector:4317/x",
        "e": "s3cret",
        "f": "${env:HOST}",
        "g": "cost $5",
        "h": "dflt",
    }


def test_unset_variable_without_default_is_empty_and_warned(tmp_path):
    warnings = []
    path = write(tmp_path, "a.yaml", "a: x${env:NOPE}y\n")
    assert load([path], env={}, warn=warnings.append) == {"a": "xy"}
    assert warnings and "NOPE" in warnings[0] and warnings[0].startswith("a:")


def test_every_problem_is_reported_with_its_place(tmp_path):
    broken = write(tmp_path, "broken.yaml", "receivers:\n  otlp: [\n")
    with pytest.raises(ConfigError) as raised:
        load([str(tmp_path / "missing.yaml"), broken], ["novalue"])
    problems = raised.value.problems
    assert len(problems) == 3
    assert "missing.yaml: cannot read config file" in problems[0]
    assert "broken.yaml:3:1: invalid YAML" in problems[1]
    assert problems[2].startswith("--set novalue: expected key=value")


def test_bad_references_name_the_key(tmp_path):
    path = write(tmp_path, "a.yaml", "exporters:\n  x:\n    token: ${vault:secret}\n    cert: ${file:/no/such/file}\n")
    with pytest.raises(ConfigError) as raised:
        load([path], env={})
    assert raised.value.problems == [
        "exporters::x::token: unsupported reference scheme 'vault' in '${vault:secret}' (supported: env, file)",
        "exporters::x::cert: cannot read '${file:/no/such/file}': No such file or directory",
    ]


@pytest.mark.parametrize(
    "text, seconds",
    [("5s", 5), ("200ms", 0.2), ("1m30s", 90), ("1.5h", 5400), ("10us", 1e-5), ("0", 0), (0, 0), ("-2s", -2)],
)
def test_go_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", 5.5, "5x", "1m3", "abc", True, [1]])  # (a bare integer is nanoseconds, as in Go)
def test_durations_without_units_or_garbage_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [(5, "5s"), (0.2, "200ms"), (90, "1m30s"), (3600, "1h"), (0, "0s")])
def test_durations_print_back_in_go_spelling(seconds, text):
    assert format_duration(seconds) == text
