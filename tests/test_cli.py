"""The command line, run as a user runs it: the installed console script in a subprocess."""

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli

TESTDATA = Path(__file__).parent / "testdata" / "cli"


def test_validate_reports_all_three_mistakes_with_paths():
    result = run_cli("validate", "--config", str(TESTDATA / "three_mistakes.yaml"))
    assert result.returncode == 1
    assert "invalid configuration: 3 problems" in result.stderr
    assert "receivers::profiling::samples_per_secnd: unknown key (did you mean 'samples_per_second'?)" in result.stderr
    assert "exporters::debug::verbosity: input should be 'basic', 'normal' or 'detailed' (got 'loud')" in result.stderr
    assert "service::pipelines::profiles::exporters::1: references exporter 'otlp_grpc/backend', which is not defined under 'exporters'" in result.stderr


def test_go_collector_style_config_validates_unchanged():
    result = run_cli("validate", "--config", str(TESTDATA / "go_collector_style.yaml"))
    assert result.returncode == 0, result.stderr
    assert "valid (2 pipelines" in result.stdout


def test_missing_component_lists_the_known_types(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("receivers: {profiling: {}}\nexporters: {kafka: {}}\nservice: {pipelines: {profiles: {receivers: [profiling], exporters: [kafka]}}}\n")
    result = run_cli("validate", "--config", str(config))
    assert result.returncode == 1
    known = result.stderr.split("exporters::kafka: unknown type 'kafka' (known exporters: ")[1].split(")")[0].split(", ")
    assert {"debug", "sample_counts"} <= set(known)


def test_components_lists_builtins_and_the_third_party_plugin():
    result = run_cli("components")
    assert result.returncode == 0, result.stderr
    # The Go collector's YAML: each kind's components by type, with the module that brings them.
    document = yaml.safe_load(result.stdout)
    exporters = {entry["name"]: entry for entry in document["exporters"]}
    assert exporters["sample_counts"]["module"].startswith("pycollector-example-exporter ")
    assert exporters["debug"]["module"] == "pycollector 0.1.0"
    assert "otlp" not in exporters and "otlp_grpc" in exporters  # (deprecated names left out, as Go does)
    receivers = {entry["name"]: entry for entry in document["receivers"]}
    assert receivers["profiling"]["stability"]["profiles"] != "Undefined" and receivers["profiling"]["stability"]["traces"] == "Undefined"
    assert {"nop", "otlp"} <= set(receivers) and document["buildinfo"]["command"] == "pycollector"
    assert [provider["scheme"] for provider in document["providers"]] == ["env", "file", "http", "https", "yaml"]
    assert document["extensions"][0]["stability"].keys() == {"extension"}


def test_print_config_shows_merged_and_expanded_values(tmp_path):
    override = tmp_path / "override.yaml"
    override.write_text("exporters:\n  debug:\n    verbosity: detailed\n")
    result = run_cli(
        "print-config", "--config", str(TESTDATA / "go_collector_style.yaml"), "--config", str(override), "--set", "exporters::debug::sampling_initial=9",
        env={**os.environ, "SAMPLES": "97"},
    )
    assert result.returncode == 0, result.stderr
    assert "SamplesPerSecond: 97" in result.stdout
    assert "verbosity: detailed\n    sampling_initial: 9" in result.stdout


def test_no_config_is_a_usage_error():
    result = run_cli()
    assert result.returncode == 2 and "--config" in result.stderr


@pytest.mark.bpf
@pytest.mark.load_tolerant
def test_run_serves_moving_counters_and_stops_cleanly_on_sigint(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "receivers: {profiling: {samples_per_second: 97, reporter_interval: 1s}}\n"
        "exporters: {debug: {verbosity: basic}}\n"
        "service:\n  pipelines: {profiles: {receivers: [profiling], exporters: [debug]}}\n"
        "  telemetry: {metrics: {address: '127.0.0.1:18888'}}\n"
    )
    process = subprocess.Popen([str(Path(os.sys.executable).parent / "pycollector"), "--config", str(config), "--log-format", "json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        readings = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and len(set(readings)) < 3:
            time.sleep(0.5)
            try:
                text = urllib.request.urlopen("http://127.0.0.1:18888/metrics", timeout=2).read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith('otelcol_exporter_sent_profile_samples_total{exporter="debug"}'):
                    readings.append(float(line.split()[-1]))
        assert len(set(readings)) >= 3 and readings == sorted(readings), f"sent counter did not keep moving: {readings}"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert '"event": "stopped cleanly"' in stderr
