"""The agent as the README deploys it: the command prefix that runs a program with exactly the
user and capabilities of the systemd unit or of the DaemonSet's container, read from the files in
deploy/ (no systemd or kubelet runs here, and setpriv gives a process what each would give it)."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "deploy" / "systemd" / "pycollector.service"
DAEMONSET = REPO / "deploy" / "kubernetes" / "agent.yaml"
DYNAMIC_USER = 61234  # what DynamicUser= picks from (61184-65519): a uid no file or process has

DEPLOYMENTS = ("systemd", "kubernetes")
# Where the unit's agent keeps its compiled BPF programs in the tests: its own, as the unit's
# CacheDirectory= is (root's /var/cache/pycollector/bpf is refused to another user, and each start
# would compile for seconds).
UNIT_BPF_CACHE = Path("/var/cache/pycollector-tests/bpf-unit")


def unit_bpf_cache() -> str:
    """UNIT_BPF_CACHE, made the unit user's alone (0700), as the program cache demands."""
    UNIT_BPF_CACHE.parent.mkdir(parents=True, exist_ok=True)
    UNIT_BPF_CACHE.mkdir(mode=0o700, exist_ok=True)
    os.chown(UNIT_BPF_CACHE, DYNAMIC_USER, DYNAMIC_USER)
    UNIT_BPF_CACHE.chmod(0o700)
    return str(UNIT_BPF_CACHE)


def unit_service_section() -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return dict(parser["Service"])


def unit_capabilities() -> list[str]:
    """The unit's ambient capabilities, as CAP_NAME."""
    return unit_service_section()["AmbientCapabilities"].split()


def daemonset_container() -> dict:
    [daemonset] = [doc for doc in yaml.safe_load_all(DAEMONSET.read_text()) if doc and doc.get("kind") == "DaemonSet"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def daemonset_capabilities() -> list[str]:
    """The agent container's added capabilities (it drops all others), as CAP_NAME."""
    return ["CAP_" + name for name in daemonset_container()["securityContext"]["capabilities"]["add"]]


def _setpriv_caps(capabilities: list[str]) -> str:
    return ",".join(["-all"] + ["+" + name.removeprefix("CAP_").lower() for name in capabilities])


def run_as_deployed(deployment: str) -> list[str]:
    """setpriv's arguments that run a program as ``deployment`` runs the agent: the unit's dynamic
    user with its capabilities made ambient and no_new_privs; the container's root with its
    capabilities cut to its list (runAsUser: 0, drop ALL, add) and no_new_privs
    (allowPrivilegeEscalation: false)."""
    if deployment == "systemd":
        service = unit_service_section()
        assert service["DynamicUser"] == "yes" and service["NoNewPrivileges"] == "yes"
        caps = _setpriv_caps(unit_capabilities())
        return ["setpriv", f"--reuid={DYNAMIC_USER}", f"--regid={DYNAMIC_USER}", "--clear-groups", "--no-new-privs",
                f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}"]
    if deployment == "kubernetes":
        security = daemonset_container()["securityContext"]
        assert security["runAsUser"] == 0 and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        caps = _setpriv_caps(daemonset_capabilities())
        return ["setpriv", "--no-new-privs", "--inh-caps=-all", f"--bounding-set={caps}"]
    raise ValueError(deployment)
