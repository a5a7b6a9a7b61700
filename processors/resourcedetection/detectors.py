"""What each detector finds about the host the collector runs on, as Go's detectors find it.

env      OTEL_RESOURCE_ATTRIBUTES (or the older OTEL_RESOURCE): comma-separated key=value, each
         value percent-decoded as a URL query value ('+' is a space).
system   host.name from the first hostname source that answers (dns: the name /etc/hosts or the
         resolver gives for this host, as `hostname -f`; os: the kernel's; cname; lookup: the
         reverse lookup of its address), os.type, and on request host.id (machine-id), host.arch,
         os.* (os-release), host.interface, host.mac, host.cpu.* (/proc/cpuinfo).
k8s_api  k8s.node.name from the environment variable the downward API fills, k8s.node.uid and
         k8s.cluster.uid (kube-system's uid) from the API server.

These read this host, never a sampled process: nothing here is under another user's control
(/etc/hosts and os-release are root's).
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote_plus

from processors.resourcedetection.config import DEFAULT_NODE_ENV_VAR, K8sApiConfig, SystemConfig


class DetectionError(Exception):
    """A detector could not do its job; the message says which and why."""


def enabled(attributes) -> set[str]:
    """The attribute names a ``resource_attributes`` model switches on."""
    return {field.alias or name for name, field in type(attributes).model_fields.items() if getattr(attributes, name).enabled}


# -- env ------------------------------------------------------------------------------------------

MAX_ENV_KEY, MAX_ENV_VALUE = 256, 256
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def detect_env(environ: dict[str, str]) -> dict[str, Any]:
    text = environ.get("OTEL_RESOURCE_ATTRIBUTES", "").strip() or environ.get("OTEL_RESOURCE", "").strip()
    attributes: dict[str, Any] = {}
    if not text:
        return attributes
    for pair in text.split(","):
        key, equals, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key or len(key) > MAX_ENV_KEY or len(value) > MAX_ENV_VALUE or not key.isascii() or not value.isascii():
            raise DetectionError(f"env: invalid resource format in OTEL_RESOURCE_ATTRIBUTES: {pair.strip()!r} (expected key=value, ASCII, up to 256 characters each)")
        if _BAD_ESCAPE.search(value):
            raise DetectionError(f"env: invalid resource format in attribute {pair.strip()!r}: a '%' not followed by two hex digits")
        attributes[key] = unquote_plus(value)
    return attributes


# -- system ---------------------------------------------------------------------------------------

ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm32", "armv6l": "arm32",
                 "i386": "x86", "i686": "x86", "ppc64le": "ppc64", "s390x": "s390x"}
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
OS_RELEASE_FILES = ("/etc/os-release", "/usr/lib/os-release")


def detect_system(config: SystemConfig, log=None) -> dict[str, Any]:
    wanted = enabled(config.resource_attributes)
    attributes: dict[str, Any] = {}
    name = _host_name(config.hostname_sources)  # (Go fails the detector when no source answers, wanted or not)
    if "host.name" in wanted:
        attributes["host.name"] = name
    if "os.type" in wanted:
        attributes["os.type"] = "linux" if sys.platform.startswith("linux") else sys.platform
    if "host.id" in wanted:
        machine_id = _first_line(MACHINE_ID_FILES)
        if machine_id:
            attributes["host.id"] = machine_id
        elif log is not None:
            log.warning("host.id: no machine id (/etc/machine-id, /var/lib/dbus/machine-id); left out")
    if "host.arch" in wanted:
        machine = platform.machine()
        attributes["host.arch"] = ARCHITECTURES.get(machine, machine)
    if wanted & {"os.description", "os.name", "os.version", "os.build.id"}:
        attributes.update(_os_release_attributes(wanted))
    if "host.interface" in wanted:
        attributes["host.interface"] = [name for _, name in socket.if_nameindex()]
    if "host.mac" in wanted:
        attributes["host.mac"] = _mac_addresses()
    cpu_wanted = {key for key in wanted if key.startswith("host.cpu.")}
    if cpu_wanted:
        attributes.update({key: value for key, value in _cpu_attributes().items() if key in cpu_wanted})
    return attributes


def _host_name(sources: list[str]) -> str:
    tried = []
    for source in sources:
        try:
            name = HOSTNAME_SOURCES[source]()
        except OSError as error:
            tried.append(f"{source}: {error}")
            continue
        if name:
            return name.rstrip(".")
        tried.append(f"{source}: no name")
    raise DetectionError(f"system: all hostname sources failed to get a host name ({'; '.join(tried)})")


def _from_hosts_file(hostname: str) -> str:
    """The canonical name /etc/hosts gives this host (`hostname -f` looks there first)."""
    try:
        lines = Path("/etc/hosts").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and hostname in fields[1:] and re.fullmatch(r"[\w.\-]+", fields[1]):
            return fields[1]
    return ""


def _dns_name() -> str:
    hostname = socket.gethostname()
    name = _from_hosts_file(hostname)
    if name:
        return name
    infos = socket.getaddrinfo(hostname, None, flags=socket.AI_CANONNAME)
    return next((info[3] for info in infos if info[3]), "")


def _cname() -> str:
    return socket.gethostbyname_ex(socket.gethostname())[0]


def _lookup() -> str:
    address = socket.gethostbyname(socket.gethostname())
    return socket.gethostbyaddr(address)[0]


HOSTNAME_SOURCES = {"os": socket.gethostname, "dns": _dns_name, "cname": _cname, "lookup": _lookup}


def _first_line(paths) -> str:
    for path in paths:
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return ""


def _os_release() -> dict[str, str]:
    for path in OS_RELEASE_FILES:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        fields = {}
        for line in text.splitlines():
            key, equals, value = line.partition("=")
            if equals:
                fields[key.strip()] = value.strip().strip("\"'")
        return fields
    return {}


def _os_release_attributes(wanted: set[str]) -> dict[str, str]:
    release, uname = _os_release(), os.uname()
    attributes = {}
    if "os.name" in wanted and release.get("ID"):
        attributes["os.name"] = release["ID"]
    if "os.version" in wanted:
        attributes["os.version"] = _first_line(("/etc/debian_version",)) or release.get("VERSION_ID", "") or uname.release
    if "os.build.id" in wanted:
        attributes["os.build.id"] = release.get("BUILD_ID") or uname.release
    if "os.description" in wanted:
        kernel = f"{uname.sysname} {uname.nodename} {uname.release} {uname.version} {uname.machine}"
        name, version = release.get("NAME", ""), release.get("VERSION") or release.get("VERSION_ID", "")
        described = f"{name} {version}" if name and version else release.get("PRETTY_NAME", "")
        attributes["os.description"] = f"{described} ({kernel})" if described else kernel
    return attributes


def _mac_addresses() -> list[str]:
    """Hardware addresses of the interfaces that are up, but loopback, as Go writes them."""
    addresses = []
    for interface in sorted(os.listdir("/sys/class/net")):
        base = Path("/sys/class/net") / interface
        try:
            flags = int((base / "flags").read_text().strip(), 16)
            address = (base / "address").read_text().strip()
        except (OSError, ValueError):
            continue
        if flags & 0x1 and not flags & 0x8:  # IFF_UP, not IFF_LOOPBACK
            addresses.append(address.upper().replace(":", "-"))
    return addresses


def _cpu_attributes() -> dict[str, Any]:
    """The first processor of /proc/cpuinfo."""
    try:
        block = Path("/proc/cpuinfo").read_text(errors="replace").split("\n\n", 1)[0]
    except OSError as error:
        raise DetectionError(f"system: cannot read /proc/cpuinfo: {error.strerror}") from None
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in block.splitlines())}
    attributes: dict[str, Any] = {}
    for attribute, key in (("host.cpu.vendor.id", "vendor_id"), ("host.cpu.family", "cpu family"), ("host.cpu.model.id", "model"),
                           ("host.cpu.model.name", "model name"), ("host.cpu.stepping", "stepping")):
        if fields.get(key):
            attributes[attribute] = fields[key]
    cache = fields.get("cache size", "").split()
    if cache and cache[0].isdigit():
        attributes["host.cpu.cache.l2.size"] = int(cache[0])
    return attributes


# -- k8s_api --------------------------------------------------------------------------------------


def detect_k8s(config: K8sApiConfig, environ: dict[str, str], detector: str) -> dict[str, Any]:
    from pycollector.kubernetes.access import AuthError, api_access
    from pycollector.kubernetes.client import ApiClient, ApiError

    variable = config.node_from_env_var or DEFAULT_NODE_ENV_VAR
    node = environ.get(variable, "")
    if not node:
        raise DetectionError(f"{detector}: node name can't be found: environment variable {variable} is not set "
                             "(give it the pod's spec.nodeName through the downward API)")
    wanted = enabled(config.resource_attributes)
    attributes: dict[str, Any] = {}
    if "k8s.node.name" in wanted:
        attributes["k8s.node.name"] = node
    if not wanted & {"k8s.node.uid", "k8s.cluster.uid"}:
        return attributes
    try:
        # (k8s_attributes' way to the API server; this detector has no endpoint of its own)
        access = api_access(SimpleNamespace(auth_type=config.auth_type, context=config.context, endpoint=""))
    except AuthError as error:
        raise DetectionError(f"{detector}: {error}") from None
    client = ApiClient(access)
    try:
        if "k8s.node.uid" in wanted:
            attributes["k8s.node.uid"] = _uid_of(client, "/api/v1/nodes", node, detector)
        if "k8s.cluster.uid" in wanted:
            try:
                attributes["k8s.cluster.uid"] = _uid_of(client, "/api/v1/namespaces", "kube-system", detector)
            except ApiError as error:
                if error.code not in (401, 403):
                    raise
                # (as Go: no right to read kube-system costs the attribute, not the detector)
    except ApiError as error:
        raise DetectionError(f"{detector}: the API server refused: {error}") from None
    except OSError as error:
        raise DetectionError(f"{detector}: cannot reach the API server {access.server}: {error}") from None
    finally:
        client.close()
        access.close()
    return attributes


def _uid_of(client, collection: str, name: str, detector: str) -> str:
    items, _ = client.list(collection, {"fieldSelector": f"metadata.name={name}"})
    uid = next((item.get("metadata", {}).get("uid", "") for item in items), "")
    if not uid:
        raise DetectionError(f"{detector}: {collection.rsplit('/', 1)[-1][:-1]} {name!r} not found, or has no uid")
    return uid


# -- all of them ----------------------------------------------------------------------------------


def detect(config, environ: dict[str, str] | None = None, log=None) -> dict[str, Any]:
    """Every detector's attributes, in the config's order: the first to give one wins."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for name in config.detectors:
        if name == "env":
            attributes = detect_env(environ)
        elif name == "system":
            attributes = detect_system(config.system, log)
        else:
            attributes = detect_k8s(config.k8s_api if name == "k8s_api" else config.k8snode, environ, name)
        for key, value in attributes.items():
            found.setdefault(key, value)
    return found
