"""Only agents get in: the bearertokenauth and basicauth extensions on the otlp receiver's gRPC and
HTTP servers and on the OTLP exporters, written as Go configs write them, with real servers and
clients on loopback (gRPC with TLS, as gRPC sends credentials only over it)."""

from __future__ import annotations

import base64
import secrets
import subprocess
import time

import bcrypt
import grpc
import pytest
import requests
from google.rpc import status_pb2
from structlog.testing import capture_logs

from pycollector.component import AS_WRITTEN, PermanentError, StartError
from pycollector.otlp import OTLP_SIGNALS
from pycollector.registry import Registry
from pycollector.testing import TestHost, make_settings
from receivers.otlp.factory import factory as receiver_factory
from tests.test_otlp_exporters import self_signed
from tests.test_otlp_support import ClientRecorder, a_profile, sample_tuples

TOKEN = secrets.token_hex(16)
WRONG = secrets.token_hex(16)


def extension(type_: str, config: dict, name: str = ""):
    factory = Registry().load("extensions", type_).factory
    created = factory.create(make_settings("extensions", f"{type_}/{name}" if name else type_), factory.config_model.model_validate(config), None)
    created.start(TestHost())
    return created


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"), "gateway.test")


@pytest.fixture
def gateway(certificate):
    """A started otlp receiver (gRPC with TLS, HTTP) whose servers ask the authenticator given."""
    made = []

    def start(authenticator, http: dict | None = None):
        cert, key = certificate
        auth = {"authenticator": "auth/server"}
        config = receiver_factory.config_model.model_validate({"protocols": {
            "grpc": {"endpoint": "127.0.0.1:0", "tls": {"cert_file": cert, "key_file": key}, "auth": auth},
            "http": {"endpoint": "127.0.0.1:0", "auth": {**auth, **(http or {})}}}})
        consumer = ClientRecorder()
        settings = make_settings("receivers", "otlp")
        receiver = receiver_factory.create(settings, config, consumer)
        receiver.start(TestHost({"auth/server": authenticator}))
        made.append(receiver)
        return receiver, consumer, settings

    yield start
    for receiver in made:
        receiver.shutdown()


def grpc_export(receiver, certificate, metadata) -> tuple[grpc.StatusCode, str]:
    cert, _ = certificate
    otlp = OTLP_SIGNALS["profiles"]
    credentials = grpc.ssl_channel_credentials(root_certificates=open(cert, "rb").read())
    with grpc.secure_channel("{}:{}".format(*receiver.grpc_address), credentials, options=[("grpc.ssl_target_name_override", "gateway.test")]) as channel:
        call = channel.unary_unary(otlp.grpc_method, request_serializer=lambda message: message.SerializeToString(), response_deserializer=otlp.response_type.FromString)
        try:
            call(a_profile(), timeout=10, metadata=metadata)
        except grpc.RpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def http_export(receiver, headers: dict, content_type: str = "application/x-protobuf") -> requests.Response:
    body = a_profile().SerializeToString() if content_type.endswith("protobuf") else b"{}"
    return requests.post("http://{}:{}/v1development/profiles".format(*receiver.http_address), data=body,
                         headers={"Content-Type": content_type, **headers}, timeout=10)


def refusals(settings, transport: str) -> float:
    return settings.telemetry.telemetry.sample("pycollector_receiver_unauthenticated_requests_total", {"transport": transport, **settings.telemetry.labels}) or 0.0


def test_a_bearer_token_lets_in_the_agents_that_send_it_and_refuses_the_others_by_name(gateway, certificate):
    server = extension("bearertokenauth", {"token": TOKEN}, "server")
    receiver, consumer, settings = gateway(server)
    with capture_logs() as logged:
        assert grpc_export(receiver, certificate, None) == (grpc.StatusCode.UNAUTHENTICATED, "missing or empty authorization header: Authorization")
        assert grpc_export(receiver, certificate, [("authorization", f"Bearer {WRONG}")]) == (
            grpc.StatusCode.UNAUTHENTICATED, "provided authorization does not match expected scheme or token")
        assert grpc_export(receiver, certificate, [("authorization", f"Bearer {TOKEN}")]) == (grpc.StatusCode.OK, "")
        missing, wrong = http_export(receiver, {}), http_export(receiver, {"Authorization": f"Bearer {WRONG}"}, "application/json")
        assert (missing.status_code, wrong.status_code) == (401, 401)
        refusal = status_pb2.Status.FromString(missing.content)
        assert (refusal.code, refusal.message) == (16, "missing or empty authorization header: Authorization")
        assert wrong.headers["Content-Type"] == "application/json" and "does not match" in wrong.json()["message"]
        assert http_export(receiver, {"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        # Go runs the authenticator before the routes: an unknown path is 401 too, not 404.
        assert requests.get("http://{}:{}/nowhere".format(*receiver.http_address), timeout=10).status_code == 401
    assert len(consumer.messages) == 2 and all(sample_tuples(message) == sample_tuples(a_profile()) for message in consumer.messages)
    assert (refusals(settings, "grpc"), refusals(settings, "http")) == (2, 3)
    assert not any(TOKEN in repr(event) or WRONG in repr(event) for event in logged), logged


@pytest.mark.parametrize("exporter", ["otlp_grpc", "otlp_http"])
def test_an_agents_otlp_exporter_sends_its_token_and_a_wrong_one_is_not_retried(gateway, certificate, exporter):
    receiver, consumer, settings = gateway(extension("bearertokenauth", {"token": TOKEN}, "server"))
    cert, _ = certificate
    factory = Registry().load("exporters", exporter).factory
    endpoint = "{}:{}".format(*receiver.grpc_address) if exporter == "otlp_grpc" else "http://{}:{}".format(*receiver.http_address)

    def send(token: str) -> None:
        config = factory.config_model.model_validate({"endpoint": endpoint, "auth": {"authenticator": "bearertokenauth/agent"},
                                                      "tls": {"ca_file": cert, "server_name_override": "gateway.test"},
                                                      "retry_on_failure": {"enabled": False}, "sending_queue": {"enabled": False}})
        instance = factory.create(make_settings("exporters", exporter), config, None)
        instance.start(TestHost({"bearertokenauth/agent": extension("bearertokenauth", {"token": token}, "agent")}))
        try:
            instance.consume(a_profile())
        finally:
            instance.shutdown()

    with pytest.raises(PermanentError, match="UNAUTHENTICATED|401"):
        send(WRONG)
    send(TOKEN)
    assert consumer.wait_for(lambda c: len(c.messages) == 1, timeout=10) and len(consumer.messages) == 1
    assert refusals(settings, "grpc" if exporter == "otlp_grpc" else "http") == 1


def test_grpc_credentials_are_never_sent_in_plain_text():
    factory = Registry().load("exporters", "otlp_grpc").factory
    config = factory.config_model.model_validate({"endpoint": "127.0.0.1:4317", "tls": {"insecure": True}, "auth": {"authenticator": "bearertokenauth"}})
    instance = factory.create(make_settings("exporters", "otlp_grpc"), config, None)
    with pytest.raises(StartError, match="exporters::otlp_grpc::auth: bearertokenauth gives credentials, which are sent only over TLS"):
        instance.start(TestHost({"bearertokenauth": extension("bearertokenauth", {"token": TOKEN})}))


def htpasswd_lines() -> str:
    """Users whose hashes come from other tools than the one checking them: openssl's APR1 (Apache's
    default) and SHA-512-crypt, and the bcrypt library's $2b$ (Apache writes $2y$)."""
    apr1 = subprocess.run(["openssl", "passwd", "-apr1", "alice-secret"], capture_output=True, text=True, check=True).stdout.strip()
    sha512 = subprocess.run(["openssl", "passwd", "-6", "bob-secret"], capture_output=True, text=True, check=True).stdout.strip()
    hashed = bcrypt.hashpw(b"carol-secret", bcrypt.gensalt(rounds=5)).decode().replace("$2b$", "$2y$")
    return f"alice:{apr1}\nbob:{sha512}\ncarol:{hashed}\n"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth_checks_htpasswd_hashes_and_hands_the_user_name_downstream(gateway, certificate, tmp_path):
    (tmp_path / ".htpasswd").write_text(htpasswd_lines())
    receiver, consumer, settings = gateway(extension("basicauth", {"htpasswd": {"file": str(tmp_path / ".htpasswd"), "inline": "dave:plain-secret"}}))
    for user in ("alice", "bob", "carol", "dave"):
        password = "plain-secret" if user == "dave" else f"{user}-secret"
        assert http_export(receiver, basic(user, password)).status_code == 200, user
    assert grpc_export(receiver, certificate, [("authorization", basic("carol", "carol-secret")["Authorization"])]) == (grpc.StatusCode.OK, "")
    assert [client.auth for client in consumer.clients] == [{"username": user} for user in ("alice", "bob", "carol", "dave", "carol")]
    for headers, reason in (({}, "no basic auth provided"), (basic("alice", "wrong"), "invalid credentials"),
                            (basic("mallory", "x"), "invalid credentials"), ({"Authorization": "Bearer x"}, "invalid authorization scheme prefix"),
                            ({"Authorization": "Basic !!!"}, "invalid authorization format")):
        answer = http_export(receiver, headers)
        assert (answer.status_code, status_pb2.Status.FromString(answer.content).message) == (401, reason)
    assert refusals(settings, "http") == 5 and len(consumer.messages) == 5
    # The client side: an exporter with basicauth's client_auth gets in as that user.
    factory = Registry().load("exporters", "otlp_http").factory
    config = factory.config_model.model_validate({"endpoint": "http://{}:{}".format(*receiver.http_address), "auth": {"authenticator": "basicauth/client"},
                                                  "retry_on_failure": {"enabled": False}, "sending_queue": {"enabled": False}})
    instance = factory.create(make_settings("exporters", "otlp_http"), config, None)
    instance.start(TestHost({"basicauth/client": extension("basicauth", {"client_auth": {"username": "bob", "password": "bob-secret"}}, "client")}))
    instance.consume(a_profile())
    instance.shutdown()
    assert consumer.clients[-1].auth == {"username": "bob"}


def test_a_rewritten_token_file_applies_to_the_next_requests_on_both_sides(gateway, tmp_path):
    tokens, sent = tmp_path / "tokens", tmp_path / "agent-token"
    tokens.write_text(f"{TOKEN}\nsecond-{TOKEN}\n")
    sent.write_text(TOKEN)
    receiver, consumer, _ = gateway(extension("bearertokenauth", {"filename": str(tokens)}))
    client = extension("bearertokenauth", {"filename": str(sent)}, "agent")
    assert http_export(receiver, client.credentials()).status_code == 200
    assert http_export(receiver, {"Authorization": f"Bearer second-{TOKEN}"}).status_code == 200
    tokens.write_text(f"third-{TOKEN}\n")
    sent.write_text(f"third-{TOKEN}")
    time.sleep(1.1)  # (files are looked at once a second at most)
    assert http_export(receiver, {"Authorization": f"Bearer {TOKEN}"}).status_code == 401
    assert client.credentials() == {"Authorization": f"Bearer third-{TOKEN}"}
    assert http_export(receiver, client.credentials()).status_code == 200
    tokens.unlink()  # a file that goes away: the last tokens are kept
    time.sleep(1.1)
    assert http_export(receiver, client.credentials()).status_code == 200 and len(consumer.messages) == 4


def test_query_parameters_the_config_names_reach_the_authenticator(gateway):
    receiver, consumer, _ = gateway(extension("bearertokenauth", {"header": "api-key", "scheme": "", "token": TOKEN}), {"request_params": ["api-key"]})
    url = "http://{}:{}/v1development/profiles".format(*receiver.http_address)
    body = a_profile().SerializeToString()
    assert requests.post(f"{url}?api-key={TOKEN}", data=body, headers={"Content-Type": "application/x-protobuf"}, timeout=10).status_code == 200
    assert requests.post(f"{url}?api-key={WRONG}", data=body, headers={"Content-Type": "application/x-protobuf"}, timeout=10).status_code == 401


def test_an_authenticator_missing_or_of_the_wrong_kind_stops_the_start_by_name():
    config = receiver_factory.config_model.model_validate({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}}})
    for host, problem in ((TestHost(), 'failed to resolve authenticator "bearertokenauth": authenticator not found'),
                          (TestHost({"bearertokenauth": object()}), "requested authenticator is not a server authenticator")):
        receiver = receiver_factory.create(make_settings("receivers", "otlp"), config, ClientRecorder())
        with pytest.raises(StartError, match=f"receivers::otlp::protocols::grpc::auth: {problem}"):
            receiver.start(host)
        receiver.shutdown()


@pytest.mark.parametrize("type_, config, problem", [
    ("bearertokenauth", {}, "no bearer token provided"),
    ("bearertokenauth", {"token": "a", "tokens": ["b"]}, "either tokens or token should be provided, not both"),
    ("basicauth", {}, "no credential source provided"),
    ("basicauth", {"htpasswd": {"inline": "a:b"}, "client_auth": {"username": "a"}}, "only one of `htpasswd` or `client_auth` can be specified"),
])
def test_what_go_refuses_in_the_extensions_config_is_refused(type_, config, problem):
    with pytest.raises(ValueError, match=problem):
        Registry().load("extensions", type_).factory.config_model.model_validate(config, context=AS_WRITTEN)


def test_a_token_file_that_cannot_be_read_stops_the_start(tmp_path):
    (tmp_path / "empty").write_text("\n")
    for path, problem in ((tmp_path / "missing", "No such file"), (tmp_path / "empty", "is empty")):
        with pytest.raises(StartError, match=f'failed to read credentials file "{path}": .*{problem}'):
            extension("bearertokenauth", {"filename": str(path)})


GO_CONFIG = """
extensions:
  bearertokenauth/receiver:
    token: "somerandomtoken"
  bearertokenauth/exporter:
    token: "somerandomtoken"
  basicauth/server:
    htpasswd:
      inline: |
        user:password
receivers:
  otlp/withauth:
    protocols:
      grpc:
        auth:
          authenticator: bearertokenauth/receiver
      http:
        auth:
          authenticator: basicauth/server
exporters:
  otlp/withauth:
    endpoint: 0.0.0.0:5000
    tls:
      ca_file: /tmp/certs/ca.pem
    auth:
      authenticator: bearertokenauth/exporter
  otlphttp/withauth:
    endpoint: http://localhost:9000
    auth:
      authenticator: bearertokenauth/exporter
service:
  extensions: [bearertokenauth/receiver, bearertokenauth/exporter, basicauth/server]
  pipelines:
    profiles:
      receivers: [otlp/withauth]
      exporters: [otlp/withauth, otlphttp/withauth]
"""


def test_a_go_config_with_authenticators_validates(tmp_path, cli):
    (tmp_path / "config.yaml").write_text(GO_CONFIG)
    done = cli("validate", "--config", str(tmp_path / "config.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
