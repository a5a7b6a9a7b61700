"""What a Go collector user reaches for, here as there (issue 28): config sources other than a file
(`env:`, `yaml:`, `file:`, `http://`), keys nested with `::`, `--version`, unknown feature gates
refused, the nop receiver and exporter, durations written as bare integers (nanoseconds)."""

from __future__ import annotations

import http.server
import os
import threading

import pytest

from pycollector.config import load
from pycollector.config.types import parse_duration
from tests.conftest import run_cli
from tests.test_processors_support import problems_of

AGENT = """\
receivers: {nop: {}}
exporters: {nop: {}}
service:
  telemetry: {metrics: {level: none}}
  pipelines: {profiles: {receivers: [nop], exporters: [nop]}}
"""


def test_a_config_from_an_environment_variable():
    result = run_cli("validate", "--config", "env:COLLECTOR_CONFIG", env={**os.environ, "COLLECTOR_CONFIG": AGENT})
    assert result.returncode == 0 and "valid (1 pipeline" in result.stdout, result.stderr
    unset = run_cli("validate", "--config", "env:NO_SUCH_VARIABLE_HERE")
    assert unset.returncode == 1 and "environment variable NO_SUCH_VARIABLE_HERE is not set" in unset.stderr


def test_yaml_sources_add_to_a_file_with_keys_nested_by_double_colons(tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text(AGENT)
    result = run_cli("print-config", "--config", f"file:{config}", "--config", "yaml:exporters::nop::surely_not_a_key: 1")
    assert result.returncode == 1 and "exporters::nop::surely_not_a_key: unknown key" in result.stderr, result.stderr
    result = run_cli("print-config", "--config", str(config), "--config", "yaml:processors::batch::timeout: 2s",
                     "--config", "yaml:service::pipelines::profiles::processors: [batch]")
    assert result.returncode == 0, result.stderr
    assert "processors:\n  batch:\n    timeout: 2s" in result.stdout and "processors:\n      - batch" in result.stdout, result.stdout


def test_nested_keys_merge_with_their_siblings():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as stream:
        stream.write("exporters:\n  debug::verbosity: detailed\n  debug:\n    sampling_initial: 3\n")
    try:
        assert load([stream.name])["exporters"] == {"debug": {"verbosity": "detailed", "sampling_initial": 3}}
    finally:
        os.unlink(stream.name)


class _ConfigServer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the handler's name is http.server's)
        if self.path == "/agent.yaml":
            body = AGENT.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def config_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ConfigServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_config_served_over_http(config_server):
    result = run_cli("validate", "--config", f"{config_server}/agent.yaml")
    assert result.returncode == 0 and "valid (1 pipeline" in result.stdout, result.stderr
    missing = run_cli("validate", "--config", f"{config_server}/nowhere.yaml")
    assert missing.returncode == 1 and "nowhere.yaml: HTTP 404" in missing.stderr, missing.stderr


def test_an_unknown_scheme_is_an_error_not_a_file_name():
    result = run_cli("validate", "--config", "s3:bucket/agent.yaml")
    assert result.returncode == 1 and "unsupported scheme 's3'" in result.stderr, result.stderr


def test_version_prints_as_the_go_collector_does():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("pycollector version "), result


def test_an_unknown_feature_gate_is_refused_by_name():
    result = run_cli("validate", "--feature-gates", "service.profilesSupport,nosuch.gate", "--config", "env:COLLECTOR_CONFIG",
                     env={**os.environ, "COLLECTOR_CONFIG": AGENT})
    assert result.returncode == 1 and 'no such feature gate "nosuch.gate"' in result.stderr, result.stderr
    known = run_cli("validate", "--feature-gates", "+service.profilesSupport", "--config", "env:COLLECTOR_CONFIG",
                    env={**os.environ, "COLLECTOR_CONFIG": AGENT})
    assert known.returncode == 0, known.stderr


def test_nop_receiver_and_exporter_keep_the_contract():
    from pycollector.testing import assert_conformance

    from exporters.nop.factory import factory as nop_exporter
    from receivers.nop.factory import factory as nop_receiver

    assert_conformance(nop_receiver, "receivers")
    assert_conformance(nop_exporter, "exporters")


def test_a_bare_integer_duration_is_nanoseconds_as_in_go():
    assert parse_duration(5) == pytest.approx(5e-9)
    assert parse_duration(1_500_000_000) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration("5")  # (a string is Go's duration syntax, which needs a unit)
    with pytest.raises(ValueError, match="needs a unit"):
        parse_duration(1.5)


# -- what Go refuses is refused here, with the key's path ----------------------------------------


@pytest.mark.parametrize("section, type_, config, problem", [
    ("exporters", "otlp_grpc", {}, "exporters::otlp_grpc::endpoint: required key is missing"),
    ("exporters", "otlp_grpc", {"endpoint": "unix://"}, "exporters::otlp_grpc::endpoint: unix socket path cannot be empty"),
    ("exporters", "otlp_http", {"compression": "gzip"}, "exporters::otlp_http::endpoint: required key is missing"),
    ("exporters", "file", {"format": "json"}, "exporters::file::path: required key is missing"),
    ("processors", "resource", {}, "processors::resource::attributes: required key is missing"),
    ("receivers", "otlp", {"protocols": {"http": {"traces_url_path": ":invalid"}}}, "receivers::otlp::protocols::http::traces_url_path: invalid HTTP URL path"),
    ("receivers", "otlp", {"protocols": {"http": {"logs_url_path": "/v1/%zz"}}}, "receivers::otlp::protocols::http::logs_url_path: invalid HTTP URL path"),
])
def test_what_go_refuses_is_refused_naming_the_key(section, type_, config, problem):
    problems = problems_of(section, type_, config)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


@pytest.mark.parametrize("section, type_, config", [
    ("exporters", "otlp_http", {"profiles_endpoint": "http://127.0.0.1:4318/v1development/profiles"}),
    ("exporters", "otlp_grpc", {"endpoint": "unix:///run/otel.sock"}),
    ("receivers", "otlp", {"protocols": {"http": {"traces_url_path": "v2/traces?x=1"}}}),
])
def test_what_go_accepts_is_accepted(section, type_, config):
    assert problems_of(section, type_, config) == []
