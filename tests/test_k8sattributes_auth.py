"""Finding the API server and credentials: in-cluster service account, kubeconfig, none."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from pycollector.component import StartError

from pycollector.kubernetes import access as auth
from pycollector.kubernetes.access import AuthError, api_access
from processors.k8sattributes.config import K8sAttributesConfig
from tests.test_k8sattributes_fake_api import FakeKubeApi, checkout_cluster, profile, running


@pytest.fixture
def service_account(tmp_path, monkeypatch):
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("token-1\n")
    (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(auth, "SERVICE_ACCOUNT_DIR", str(directory))
    return directory


def access_for(**config):
    return api_access(K8sAttributesConfig.model_validate(config))


def test_service_account_uses_the_pod_environment_the_mounted_token_and_ca(service_account, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    access = access_for()
    assert (access.server, access.verify, access.headers()) == ("https://10.96.0.1:443", str(service_account / "ca.crt"), {"Authorization": "Bearer token-1"})
    (service_account / "token").write_text("token-2")  # the kubelet rotates it
    assert access.headers() == {"Authorization": "Bearer token-2"}
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert access_for().server == "https://[fd00::1]:443"


def test_outside_a_pod_service_account_fails_start_with_what_to_do(service_account, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(StartError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set.*auth_type: kubeConfig"):
        with running({}):
            pass
    monkeypatch.setattr(auth, "SERVICE_ACCOUNT_DIR", "/nonexistent")
    with pytest.raises(AuthError, match="/nonexistent/token is missing"):
        access_for(endpoint="https://10.0.0.1:6443")


def test_none_has_no_credentials_and_no_certificate_check(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    access = access_for(auth_type="none")
    assert (access.server, access.verify, access.headers(), access.client_cert) == ("https://10.96.0.1:443", False, {}, None)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def write_kubeconfig(path: Path, server: str, **user) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "kind-dev",
        "clusters": [
            {"name": "kind-dev", "cluster": {"server": server, "certificate-authority-data": _b64("DEV CA")}},
            {"name": "prod", "cluster": {"server": "https://prod.example:6443", "certificate-authority": "certs/prod-ca.crt"}},
        ],
        "contexts": [
            {"name": "kind-dev", "context": {"cluster": "kind-dev", "user": "dev", "namespace": "shop"}},
            {"name": "prod", "context": {"cluster": "prod", "user": "ops"}},
        ],
        "users": [
            {"name": "dev", "user": user or {"client-certificate-data": _b64("DEV CERT"), "client-key-data": _b64("DEV KEY")}},
            {"name": "ops", "user": {"tokenFile": "ops-token"}},
        ],
    }))
    return path


def test_kubeconfig_current_context_with_inline_certificates(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", "https://127.0.0.1:36443")))
    access = access_for(auth_type="kubeConfig")
    try:
        assert access.server == "https://127.0.0.1:36443"
        assert Path(access.verify).read_text() == "DEV CA"
        assert [Path(file).read_text() for file in access.client_cert] == ["DEV CERT", "DEV KEY"]
        assert access.headers() == {}
    finally:
        access.close()
    assert not Path(access.client_cert[0]).exists()  # inline certificates do not outlive the processor


def test_kubeconfig_context_override_and_paths_relative_to_the_file(tmp_path, monkeypatch):
    (tmp_path / "ops-token").write_text("ops-secret\n")
    first = write_kubeconfig(tmp_path / "config", "https://127.0.0.1:36443")
    empty = tmp_path / "other"
    empty.write_text("apiVersion: v1\nkind: Config\ncurrent-context: somewhere-else\n")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{empty}")  # merged as kubectl does: the first file wins
    access = access_for(auth_type="kubeConfig", context="prod")
    assert (access.server, access.verify, access.headers()) == ("https://prod.example:6443", str(tmp_path / "certs/prod-ca.crt"), {"Authorization": "Bearer ops-secret"})


@pytest.mark.parametrize(
    "user, context, message",
    [
        ({"exec": {"command": "aws", "args": ["eks", "get-token"]}}, "", "exec credential plugin, which is not supported"),
        ({"token": "t"}, "missing", "has no context named 'missing'"),
    ],
)
def test_kubeconfig_problems_are_named(tmp_path, monkeypatch, user, context, message):
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", "https://127.0.0.1:36443", **user)))
    with pytest.raises(AuthError, match=message):
        access_for(auth_type="kubeConfig", context=context)


def test_kubeconfig_token_reaches_the_api_server_and_a_wrong_one_fails_start_with_the_servers_answer(tmp_path, monkeypatch):
    with FakeKubeApi(token="s3cret") as api:
        checkout_cluster(api)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", api.url, token="s3cret")))
        with running({"auth_type": "kubeConfig", "wait_for_metadata": True}) as processor:
            [resource] = processor.resources(profile(**{"k8s.pod.ip": "10.244.1.17"}))
        assert resource["k8s.pod.name"] == "checkout-6f7c9d8b4d-x2x9q"

        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", api.url, token="wrong")))
        with pytest.raises(StartError, match="pods: HTTP 401: Unauthorized"):
            with running({"auth_type": "kubeConfig", "wait_for_metadata": True, "wait_for_metadata_timeout": "300ms"}):
                pass
