"""Where the Kubernetes API is and how to prove who we are to it, per `auth_type`.

serviceAccount  in a pod: KUBERNETES_SERVICE_HOST/PORT, the mounted token and CA.
kubeConfig      as kubectl: KUBECONFIG (or ~/.kube/config), its current (or the given) context.
none            the in-cluster address without credentials or certificate checks, as Go does.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

AUTH_NONE = "none"
AUTH_SERVICE_ACCOUNT = "serviceAccount"
AUTH_KUBE_CONFIG = "kubeConfig"

# Where Kubernetes mounts a pod's service-account credentials. Read at call time so tests can
# point it at a directory of their own.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_KUBECONFIG = "~/.kube/config"


class AuthError(Exception):
    """The API server or the credentials could not be determined; the message says what to fix."""


@dataclasses.dataclass
class ApiAccess:
    """Everything a request to the API server needs."""

    server: str  # "https://10.0.0.1:443"
    verify: bool | str = True  # False, or a CA bundle file, as requests takes it
    client_cert: tuple[str, str] | None = None  # (certificate file, key file)
    # Called per request: service-account tokens are rotated on disk while we run.
    token: Callable[[], str] | None = None
    temp_dir: str | None = None  # holds certificates that came inline in a kubeconfig

    def headers(self) -> dict[str, str]:
        token = self.token() if self.token else ""
        return {"Authorization": f"Bearer {token}"} if token else {}

    def close(self) -> None:
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def api_access(config: Any) -> ApiAccess:
    """As a component's ``auth_type`` (and ``context``, ``endpoint``) say."""
    if config.auth_type == AUTH_KUBE_CONFIG:
        access = _from_kubeconfig(config.context)
        access.server = config.endpoint or access.server
        return access
    server = config.endpoint or _in_cluster_server()
    return ApiAccess(server, verify=False) if config.auth_type == AUTH_NONE else _service_account(server)


def default_access() -> ApiAccess:
    """Where a component with no ``auth_type`` finds the API, as Go's controller-runtime does:
    the kubeconfig KUBECONFIG names, else the pod's service account, else ~/.kube/config."""
    if os.environ.get("KUBECONFIG"):
        return _from_kubeconfig("")
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return _service_account(_in_cluster_server())
    if os.path.isfile(os.path.expanduser(DEFAULT_KUBECONFIG)):
        return _from_kubeconfig("")
    raise AuthError("not in a pod (KUBERNETES_SERVICE_HOST is not set) and no kubeconfig (set KUBECONFIG, or create ~/.kube/config)")


def _in_cluster_server() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise AuthError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set, so this is not running in a pod: "
            "use auth_type: kubeConfig, or set endpoint"
        )
    try:
        host = f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        pass  # a host name
    return f"https://{host}:{port}"


def _service_account(server: str) -> ApiAccess:
    directory = Path(SERVICE_ACCOUNT_DIR)
    token_file, ca_file = directory / "token", directory / "ca.crt"
    for needed in (token_file, ca_file):
        if not needed.is_file():
            raise AuthError(f"auth_type serviceAccount: {needed} is missing (is a service account token mounted in this pod?)")
    return ApiAccess(server, verify=str(ca_file), token=_token_file_reader(token_file))


def _token_file_reader(path: Path) -> Callable[[], str]:
    return lambda: path.read_text().strip()


def _from_kubeconfig(context_name: str) -> ApiAccess:
    kubeconfig = _KubeConfig.load(os.environ.get("KUBECONFIG") or os.path.expanduser(DEFAULT_KUBECONFIG))
    name = context_name or kubeconfig.current_context
    if not name:
        raise AuthError(f"kubeconfig {kubeconfig.describe()} has no current-context; set context")
    context = kubeconfig.entry("contexts", name)[0].get("context", {})
    cluster_entry, cluster_dir = kubeconfig.entry("clusters", context.get("cluster", ""))
    user_entry, user_dir = kubeconfig.entry("users", context["user"]) if context.get("user") else ({}, Path("."))
    cluster, user = cluster_entry.get("cluster", {}), user_entry.get("user", {})
    if not cluster.get("server"):
        raise AuthError(f"kubeconfig cluster {context.get('cluster')!r} has no server")
    for plugin in ("exec", "auth-provider"):
        if plugin in user:
            raise AuthError(f"kubeconfig user {context.get('user')!r} uses an {plugin} credential plugin, which is not supported: give it a token or a client certificate")
    access = ApiAccess(cluster["server"].rstrip("/"))
    inline = _InlineFiles()
    if cluster.get("insecure-skip-tls-verify"):
        access.verify = False
    elif cluster.get("certificate-authority-data"):
        access.verify = inline.write("ca.crt", cluster["certificate-authority-data"])
    elif cluster.get("certificate-authority"):
        access.verify = str(cluster_dir / cluster["certificate-authority"])
    cert = _file_or_data(user, "client-certificate", user_dir, inline, "client.crt")
    key = _file_or_data(user, "client-key", user_dir, inline, "client.key")
    if cert and key:
        access.client_cert = (cert, key)
    if user.get("token"):
        token = user["token"]
        access.token = lambda: token
    elif user.get("tokenFile"):
        access.token = _token_file_reader(user_dir / user["tokenFile"])
    access.temp_dir = inline.directory
    return access


def _file_or_data(entry: dict, key: str, base: Path, inline: "_InlineFiles", file_name: str) -> str | None:
    if entry.get(f"{key}-data"):
        return inline.write(file_name, entry[f"{key}-data"])
    if entry.get(key):
        return str(base / entry[key])
    return None


class _InlineFiles:
    """Certificates given inline (base64) in a kubeconfig, written out because TLS loads files."""

    def __init__(self) -> None:
        self.directory: str | None = None

    def write(self, name: str, data: str) -> str:
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="pycollector-k8s-")
        path = os.path.join(self.directory, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
            out.write(base64.b64decode(data))
        return path


@dataclasses.dataclass
class _KubeConfig:
    """One or several kubeconfig files merged as kubectl does: the first file naming an entry wins."""

    files: list[Path]
    current_context: str
    entries: dict[str, dict[str, tuple[dict, Path]]]  # section -> name -> (entry, directory of its file)

    @classmethod
    def load(cls, paths: str) -> "_KubeConfig":
        files = [Path(os.path.expanduser(p)) for p in paths.split(os.pathsep) if p]
        existing = [f for f in files if f.is_file()]
        if not existing:
            raise AuthError(f"auth_type kubeConfig: no kubeconfig file at {paths} (set KUBECONFIG)")
        current, entries = "", {"clusters": {}, "contexts": {}, "users": {}}
        for path in existing:
            try:
                document: Any = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError) as error:
                raise AuthError(f"kubeconfig {path} cannot be read: {error}") from None
            current = current or document.get("current-context", "")
            for section, named in entries.items():
                for entry in document.get(section) or []:
                    named.setdefault(entry.get("name", ""), (entry, path.parent))
        return cls(existing, current, entries)

    def describe(self) -> str:
        return os.pathsep.join(str(f) for f in self.files)

    def entry(self, section: str, name: str) -> tuple[dict, Path]:
        """The named entry and the directory its relative paths are relative to."""
        try:
            return self.entries[section][name]
        except KeyError:
            raise AuthError(f"kubeconfig {self.describe()} has no {section[:-1]} named {name!r}") from None
