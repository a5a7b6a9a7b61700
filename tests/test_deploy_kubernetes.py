"""deploy/kubernetes: the kustomize base builds (`kubectl kustomize`, as `kubectl apply -k` builds
it), every object it makes passes the Kubernetes JSON schemas (kubernetes-validate, strict: an
unknown field fails), the collector configs its ConfigMaps carry validate with the environment
their pods give them, and the ClusterRole grants exactly what k8s_attributes watches."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pycollector.config import load

from processors.k8sattributes.config import K8sAttributesConfig
from processors.k8sattributes.rules import ExtractionRules
from processors.k8sattributes.watched import collections_to_watch

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "deploy" / "kubernetes"
UNIT = REPO / "deploy" / "systemd" / "pycollector.service"
CONFIG_FILES = {"pycollector-agent": "agent-config.yaml", "pycollector-gateway": "gateway-config.yaml"}
WORKLOADS = ("DaemonSet", "Deployment")
# The oldest release whose schema has securityContext.appArmorProfile (the agent sets it), and the
# newest the validator ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# What the downward API gives a pod, for the fields the manifests ask for.
DOWNWARD = {"spec.nodeName": "node-a", "status.podIP": "10.1.2.3"}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is missing (its kustomize builds the base)")
    built = subprocess.run(["kubectl", "kustomize", str(BASE)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return [document for document in yaml.safe_load_all(built.stdout) if document]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    [found] = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def pod_spec(objects: list[dict], kind: str) -> dict:
    return one(objects, kind)["spec"]["template"]["spec"]


def config_map_of(objects: list[dict], spec: dict) -> dict:
    """The generated ConfigMap a pod mounts (kustomize names it with a hash of its data)."""
    [name] = [volume["configMap"]["name"] for volume in spec["volumes"] if "configMap" in volume]
    return one(objects, "ConfigMap", name)


def environment(container: dict) -> dict[str, str]:
    return {variable["name"]: variable["value"] if "value" in variable else DOWNWARD[variable["valueFrom"]["fieldRef"]["fieldPath"]]
            for variable in container.get("env", [])}


def loaded_config(objects: list[dict], kind: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A workload's config file, written out of its ConfigMap, and the environment its pod has."""
    spec = pod_spec(objects, kind)
    path = tmp_path / f"{kind}.yaml"
    path.write_text(config_map_of(objects, spec)["data"]["config.yaml"])
    [container] = spec["containers"]
    return path, environment(container)


def test_the_base_makes_the_objects_the_deployment_needs(objects):
    def name(o):
        return o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] == "ConfigMap" else o["metadata"]["name"]
    assert sorted((o["kind"], name(o)) for o in objects) == sorted([
        ("Namespace", "pycollector"), ("ServiceAccount", "pycollector"), ("ClusterRole", "pycollector"),
        ("ClusterRoleBinding", "pycollector"), ("ConfigMap", "pycollector-agent"), ("ConfigMap", "pycollector-gateway"),
        ("DaemonSet", "pycollector-agent"), ("Deployment", "pycollector-gateway"), ("Service", "pycollector-gateway"),
        ("HorizontalPodAutoscaler", "pycollector-gateway"), ("Role", "pycollector-gateway-endpoints"), ("RoleBinding", "pycollector-gateway-endpoints"),
    ])
    namespaced = [o for o in objects if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"pycollector"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_passes_the_kubernetes_schemas(objects, version):
    for document in objects:
        kubernetes_validate.validate(document, version, strict=True)  # raises, naming the field


def test_the_configmaps_hold_the_config_files_the_pods_mount(objects):
    for kind in WORKLOADS:
        spec = pod_spec(objects, kind)
        config_map = config_map_of(objects, spec)
        assert config_map["data"] == {"config.yaml": (BASE / CONFIG_FILES[config_map["metadata"]["name"].rsplit("-", 1)[0]]).read_text()}
        [container] = spec["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/pycollector"]
        assert container["args"] == ["--config", "/etc/pycollector/config.yaml"] and mount["readOnly"]


@pytest.mark.parametrize("kind", WORKLOADS)
def test_each_config_validates_with_the_environment_its_pod_gives_it(objects, kind, cli, tmp_path):
    path, env = loaded_config(objects, kind, tmp_path)
    done = cli("validate", "--config", str(path), env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is not set" not in done.stderr  # every ${env:...} the config reads, the pod sets


def test_the_cluster_role_grants_exactly_what_k8s_attributes_watches(objects, tmp_path):
    """Each config's k8s_attributes section, as its pod loads it, names the collections it lists
    and watches (processors/k8sattributes/watched.py); the role allows those two verbs on those
    resources and nothing else, and is bound to the account both pods run as."""
    watched = set()
    for kind in WORKLOADS:
        path, env = loaded_config(objects, kind, tmp_path)
        section = K8sAttributesConfig.model_validate(load([str(path)], env=env)["processors"]["k8s_attributes"])
        for collection in collections_to_watch(section, ExtractionRules(section.extract, [pod.name for pod in section.exclude.pods])):
            # /api/v1/pods -> ("", "pods"); /apis/apps/v1/replicasets -> ("apps", "replicasets")
            parts = collection.path.strip("/").split("/")
            group = "" if parts[0] == "api" else parts[1]
            watched |= {(group, parts[-1], verb) for verb in ("list", "watch")}
    granted = {(group, resource, verb) for rule in one(objects, "ClusterRole")["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == watched == {(group, resource, verb) for group, resource in (("", "pods"), ("", "namespaces"), ("apps", "replicasets"))
                                  for verb in ("list", "watch")}
    binding, account = one(objects, "ClusterRoleBinding"), one(objects, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pycollector"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}]
    assert {pod_spec(objects, kind)["serviceAccountName"] for kind in WORKLOADS} == {account["metadata"]["name"]}


def test_the_agent_profiles_the_host_with_the_units_capabilities_and_sends_to_the_gateway(objects):
    spec = pod_spec(objects, "DaemonSet")
    [container] = spec["containers"]
    assert spec["hostPID"] is True
    security = container["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"] and not security.get("privileged")
    unit_caps = next(line.split("=", 1)[1].split() for line in UNIT.read_text().splitlines() if line.startswith("AmbientCapabilities="))
    assert sorted(security["capabilities"]["add"]) == sorted(cap.removeprefix("CAP_") for cap in unit_caps)
    host_paths = {volume["name"]: volume["hostPath"]["path"] for volume in spec["volumes"] if "hostPath" in volume}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    for path in ("/lib/modules", "/usr/src"):  # BCC's kernel headers
        [name] = [name for name, host in host_paths.items() if host == path]
        assert mounts[name]["mountPath"] == path and mounts[name]["readOnly"]
    config = yaml.safe_load(config_map_of(objects, spec)["data"]["config.yaml"])
    node_variables = {v["name"] for v in container["env"] if v.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName"}
    assert config["processors"]["k8s_attributes"]["filter"]["node_from_env_var"] in node_variables
    resolver = config["exporters"]["load_balancing/gateway"]["resolver"]["k8s"]
    name, namespace = resolver["service"].split(".")
    service = one(objects, "Service", name)
    assert namespace == service["metadata"]["namespace"] and set(resolver["ports"]) <= {p["port"] for p in service["spec"]["ports"]}
    assert service["spec"]["selector"].items() <= one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()


def test_the_agents_may_follow_the_gateways_endpoints_and_the_gateway_scales_by_cpu(objects):
    """The k8s resolver lists and watches the EndpointSlices of the gateway's namespace (a Role
    there, bound to the agents' account); the autoscaler scales the gateway Deployment on CPU, and
    its pods have a whole number of CPUs, the workers service::workers: auto starts."""
    role, binding = one(objects, "Role"), one(objects, "RoleBinding")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]
    assert role["metadata"]["namespace"] == one(objects, "Service", "pycollector-gateway")["metadata"]["namespace"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod_spec(objects, "DaemonSet")["serviceAccountName"], "namespace": "pycollector"}]
    autoscaler, gateway = one(objects, "HorizontalPodAutoscaler"), one(objects, "Deployment")
    assert autoscaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": gateway["metadata"]["name"]}
    assert [metric["resource"]["name"] for metric in autoscaler["spec"]["metrics"]] == ["cpu"]
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"] and container["resources"]["limits"]["cpu"].isdigit()
