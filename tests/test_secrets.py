"""Opaque values (exporters' header values: tokens) never shown: not by print-config, not in an
error message, not in the logs of a run; and still sent as they are (issue 15).

The command line runs as a user runs it (the installed console script in a subprocess), with one
token from ${env:TOKEN} and one written out in the YAML."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pydantic
import pytest

from exporters.otlp_grpc.config import OtlpGrpcConfig
from exporters.otlp_http.config import OtlpHttpConfig
from pycollector.config.types import REDACTED, UNREDACTED, OpaqueString
from pycollector.testing import receiver_of
from tests.conftest import REPO, run_cli
from tests.test_otlp_support import Answer, GrpcBackend, HttpBackend, a_profile, build_service, export_grpc, free_port

LITERAL = "literal-Qx7-k3y-in-the-yaml"


@pytest.fixture
def token() -> str:
    return "tok-" + secrets.token_hex(12)


def write_config(tmp_path: Path, backend: str = "http://127.0.0.1:9", receiver_port: int = 4317, extra_exporter: str = "") -> Path:
    config = tmp_path / "collector.yaml"
    config.write_text(
        "receivers:\n"
        f"  otlp: {{protocols: {{grpc: {{endpoint: '127.0.0.1:{receiver_port}'}}}}}}\n"
        "exporters:\n"
        "  otlp_http:\n"
        f"    endpoint: {backend}\n"
        "    headers:\n"
        "      Authorization: Bearer ${env:TOKEN}\n"
        f"      X-Literal: {LITERAL}\n"
        "      X-Plain: not-secret-but-opaque\n"
        "    retry_on_failure: {initial_interval: 50ms, randomization_factor: 0, max_interval: 200ms, max_elapsed_time: 10s}\n"
        f"{extra_exporter}"
        "service:\n"
        "  pipelines:\n"
        "    profiles: {receivers: [otlp], exporters: [otlp_http]}\n"
        "  telemetry: {metrics: {level: none}}\n"
    )
    return config


def env_with(token: str) -> dict[str, str]:
    return {**os.environ, "TOKEN": token}


def test_print_config_redacts_env_file_and_literal_secrets(tmp_path, token):
    secret_file = tmp_path / "api-key"
    secret_file.write_text(token + "-from-file")
    grpc_exporter = f"  otlp_grpc:\n    endpoint: 127.0.0.1:9\n    headers: {{x-api-key: '${{file:{secret_file}}}'}}\n"
    config = write_config(tmp_path, extra_exporter=grpc_exporter)
    with_set = ("--set", f"exporters::otlp_grpc::headers::x-from-set={token}-from-set")
    for extra in ((), ("--with-defaults",), ("--mode", "redacted")):
        result = run_cli("print-config", "--config", str(config), *with_set, *extra, env=env_with(token))
        assert result.returncode == 0, result.stderr
        assert token not in result.stdout + result.stderr and LITERAL not in result.stdout
        assert f"Authorization: '{REDACTED}'" in result.stdout and f"X-Literal: '{REDACTED}'" in result.stdout
        assert f"x-api-key: '{REDACTED}'" in result.stdout and f"x-from-set: '{REDACTED}'" in result.stdout
        assert "endpoint: http://127.0.0.1:9" in result.stdout  # what is not opaque is shown
    # The Go collector's opt-out: print-config --mode unredacted.
    result = run_cli("print-config", "--config", str(config), "--mode", "unredacted", env=env_with(token))
    assert result.returncode == 0, result.stderr
    assert f"Authorization: Bearer {token}" in result.stdout and f"X-Literal: {LITERAL}" in result.stdout
    assert f"x-api-key: {token}-from-file" in result.stdout and REDACTED not in result.stdout


def test_a_bad_opaque_value_is_reported_by_path_without_echoing_it(tmp_path, token):
    config = write_config(tmp_path)
    result = run_cli("validate", "--config", str(config), "--set", "exporters::otlp_http::headers::X-Number=918273645", env=env_with(f"{token}\r\nX-Injected: 1"))
    assert result.returncode == 1
    assert "exporters::otlp_http::headers::Authorization: a header value cannot hold control characters (CR, LF, NUL, ...) (got [REDACTED])" in result.stderr
    assert "exporters::otlp_http::headers::X-Number: input should be a valid string (got [REDACTED])" in result.stderr
    assert token not in result.stderr and "918273645" not in result.stderr and "X-Injected" not in result.stderr
    # A map where a header value belongs, and a string where the map of headers belongs.
    result = run_cli("validate", "--config", str(config), "--set", f"exporters::otlp_http::headers={token}", env=env_with(token))
    assert result.returncode == 1 and "exporters::otlp_http::headers: input should be a valid dictionary (got [REDACTED])" in result.stderr
    assert token not in result.stderr
    # print-config checks the config first: nothing of an invalid one is printed.
    result = run_cli("print-config", "--config", str(config), "--set", f"exporters::otlp_http::headers::X-Bad=\"{token}\\n\"", env=env_with(token))
    assert result.returncode == 1 and result.stdout == "" and token not in result.stderr


def test_the_exporter_sends_the_real_headers_and_the_json_logs_never_show_them(tmp_path, token):
    receiver_port = free_port()
    # The first answer fails, so the run logs an export failure as well.
    with HttpBackend([Answer(status=503, headers={"Retry-After": "0"}), Answer()]) as backend:
        config = write_config(tmp_path, backend=backend.endpoint, receiver_port=receiver_port)
        command = [str(Path(sys.executable).parent / "pycollector"), "--config", str(config), "--log-format", "json", "--log-level", "debug"]
        process = subprocess.Popen(command, cwd=REPO, env=env_with(token), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while export_grpc(f"127.0.0.1:{receiver_port}", a_profile(), timeout=2) != grpc.StatusCode.OK:
                assert process.poll() is None and time.monotonic() < deadline, "the collector did not start"
                time.sleep(0.2)
            assert backend.wait_for(lambda recorder: len(recorder.messages) >= 1, timeout=20), "nothing reached the backend"
            process.send_signal(signal.SIGTERM)
            stdout, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    assert len(backend.request_headers) >= 2
    for headers in backend.request_headers:
        assert headers["Authorization"] == f"Bearer {token}" and headers["X-Literal"] == LITERAL
    assert process.returncode == 0, stderr
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(event["event"] == "pycollector started" for event in events)
    assert any("503" in json.dumps(event) for event in events), "the export failure was not logged"
    assert token not in stdout + stderr and LITERAL not in stdout + stderr


def test_the_grpc_exporter_sends_the_real_metadata(token):
    with GrpcBackend() as backend:
        service = build_service(
            {
                "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
                "exporters": {"otlp_grpc": {"endpoint": backend.endpoint, "tls": {"insecure": True}, "headers": {"X-Api-Key": token}}},
                "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["otlp_grpc"]}}},
            }
        )
        service.start()
        try:
            receiver = receiver_of(service)
            host, port = receiver.grpc_address
            assert export_grpc(f"{host}:{port}", a_profile()) == grpc.StatusCode.OK
            assert backend.wait_for(lambda recorder: len(recorder.messages) >= 1)
        finally:
            service.shutdown()
    assert backend.request_headers[0]["x-api-key"] == token  # gRPC metadata keys are lower case


@pytest.mark.parametrize("model", [OtlpHttpConfig, OtlpGrpcConfig])
def test_an_opaque_value_is_hidden_wherever_python_shows_it(model, token):
    config = model.model_validate({"headers": {"Authorization": f"Bearer {token}"}})
    value = config.headers["Authorization"]
    assert isinstance(value, OpaqueString) and value.reveal() == f"Bearer {token}"
    shown = [str(config), repr(config), f"{value}", "%s %r" % (value, value), str(config.model_dump()), config.model_dump_json()]
    assert all(token not in text for text in shown) and all(REDACTED in text for text in shown)
    assert config.model_dump(mode="json", context=UNREDACTED)["headers"] == {"Authorization": f"Bearer {token}"}
    assert model.model_validate(config.model_dump(context=UNREDACTED)) == config
    with pytest.raises(pydantic.ValidationError):
        model.model_validate({"headers": {"Authorization": " leading space"}})
