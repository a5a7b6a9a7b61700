"""The loadbalancing exporter in front of three gateways (otlp receivers on loopback): every
service's profiles on exactly one gateway; a gateway killed mid-stream has its services moved to
the others and nothing is lost (every sample counted end to end); back, it gets them again. The
backends come from a static list, or from DNS (dnsmasq on loopback, which a collector run in a
mount namespace of its own asks through its /etc/resolv.conf)."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pycollector.component import AS_WRITTEN
from pycollector.pdata import iter_samples
from pycollector.pdata.builder import ProfilesBuilder
from pycollector.registry import Registry
from pycollector.testing import CapturingConsumer, TestHost, make_settings
from receivers.otlp.factory import factory as receiver_factory
from exporters.loadbalancing.ring import Ring
from tests.test_otlp_support import export_grpc, free_port

SERVICES = [f"service-{index}" for index in range(30)]
PYCOLLECTOR = Path(sys.executable).parent / "pycollector"


def profiles(services: list[str], samples_each: int, batch: int) -> object:
    """One message: a resource per service, each with ``samples_each`` samples whose value is
    ``batch`` (so a gateway's share of each batch can be told)."""
    builder = ProfilesBuilder()
    function = builder.function("main", filename="main.c")
    location = builder.location(lines=[(function, 1, 0)])
    for service in services:
        resource = builder.resource_profiles({"service.name": service, "process.pid": 1})
        profile = builder.profile(builder.scope_profiles(resource, name="test"), period=10_000_000)
        for _ in range(samples_each):
            builder.sample(profile, builder.stack([location]), [batch])
    return builder.data


class Gateway:
    """An otlp receiver on a fixed loopback address, which can be killed and brought back."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.address = f"{host}:{port or free_port()}"
        self.consumer = CapturingConsumer()
        self.receiver = None
        self.start()

    def start(self) -> None:
        config = receiver_factory.config_model.model_validate({"protocols": {"grpc": {"endpoint": self.address}}})
        self.receiver = receiver_factory.create(make_settings("receivers", "otlp"), config, self.consumer)
        self.receiver.start(TestHost())

    def kill(self) -> None:
        self.receiver.shutdown()

    def samples_by_service(self) -> collections.Counter:
        return collections.Counter(view.resource["service.name"] for message in list(self.consumer.messages) for view in iter_samples(message))


def balancer(resolver: dict, **settings):
    factory = Registry().load("exporters", "load_balancing").factory
    config = factory.config_model.model_validate({"protocol": {"otlp": {"tls": {"insecure": True}, "timeout": "2s"}}, "resolver": resolver,
                                                  "routing_key": "service", **settings}, context=AS_WRITTEN)
    exporter = factory.create(make_settings("exporters", "load_balancing"), config, None)
    exporter.start(TestHost())
    return exporter


def owners(gateways: list[Gateway]) -> dict[str, set[str]]:
    """Each service -> the gateways that got any of it."""
    found: dict[str, set[str]] = collections.defaultdict(set)
    for gateway in gateways:
        for service in gateway.samples_by_service():
            found[service].add(gateway.address)
    return found


def total(gateways: list[Gateway]) -> int:
    return sum(sum(gateway.samples_by_service().values()) for gateway in gateways)


def test_the_ring_moves_only_the_keys_of_an_endpoint_that_comes_or_goes():
    keys = [f"service-{index}" for index in range(3000)]
    three, two = Ring(["a:4317", "b:4317", "c:4317"]), Ring(["a:4317", "c:4317"])
    placed = {key: three.endpoint_for(key) for key in keys}
    spread = collections.Counter(placed.values())
    assert all(600 <= spread[endpoint] <= 1400 for endpoint in ("a:4317", "b:4317", "c:4317")), spread
    moved = [key for key in keys if two.endpoint_for(key) != placed[key]]
    assert moved and all(placed[key] == "b:4317" for key in moved) and len(moved) == spread["b:4317"]
    assert Ring(["c:4317", "b:4317", "a:4317"]).endpoint_for("x") == three.endpoint_for("x") and Ring([]).endpoint_for("x") is None


def test_each_service_lands_on_one_gateway_and_a_killed_one_loses_nothing_and_gets_its_services_back():
    gateways = [Gateway() for _ in range(3)]
    exporter = balancer({"static": {"hostnames": [gateway.address for gateway in gateways]}})
    sent = 0
    try:
        def send(batch: int) -> None:
            nonlocal sent
            exporter.consume(profiles(SERVICES, 2, batch))
            sent += 2 * len(SERVICES)

        for batch in range(5):
            send(batch)
        assert wait_until(lambda: total(gateways) == sent), (total(gateways), sent)
        before = owners(gateways)
        assert set(before) == set(SERVICES) and all(len(found) == 1 for found in before.values()), before
        assert len({next(iter(found)) for found in before.values()}) == 3  # (30 services over 3 gateways: each has some)
        victim = gateways[1]
        victims_services = {service for service, found in before.items() if victim.address in found}
        victim.kill()
        for batch in range(5, 10):
            send(batch)
        assert wait_until(lambda: total(gateways) == sent, 20), (total(gateways), sent)
        during = owners(gateways)
        assert all(len(during[service]) == 2 for service in victims_services)  # (the victim's before, another's since)
        assert all(during[service] == before[service] for service in set(SERVICES) - victims_services)
        victim.start()
        # The balancer tries it again once its time out is over (a second, doubling to ten while it
        # fails) and once its channel has connected again: sent to until its services are back.
        already, batch = victim.samples_by_service(), 10
        while set(victim.samples_by_service() - already) != victims_services and batch < 60:
            send(batch)
            batch += 1
            time.sleep(0.5)
        assert wait_until(lambda: total(gateways) == sent, 20), (total(gateways), sent)
        back = set(victim.samples_by_service() - already)
        assert back == victims_services, (back, victims_services, batch)
        assert total(gateways) == sent  # nothing lost, nothing twice
        print(f"the victim's services were back after {(batch - 10) * 0.5:.1f} s")
    finally:
        exporter.shutdown()
        for gateway in gateways:
            gateway.kill()


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- the dns resolver, against dnsmasq -----------------------------------------------------------

DNS_ADDRESS = "127.0.0.53"
GATEWAY_NAME = "gateways.pycollector.test"


@pytest.fixture
def dns(tmp_path):
    """dnsmasq on DNS_ADDRESS:53 answering GATEWAY_NAME from a hosts file the test rewrites
    (``set(addresses)``: the file written and dnsmasq told to read it again)."""
    if shutil.which("dnsmasq") is None:
        pytest.fail("dnsmasq (Debian's dnsmasq-base) is the DNS server here: scripts/setup.sh installs it")
    if os.geteuid() != 0:
        pytest.skip("a DNS server on port 53 and a mount namespace of the collector's need root")
    hosts = tmp_path / "gateways.hosts"
    hosts.write_text("")
    server = subprocess.Popen(["dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", f"--addn-hosts={hosts}", f"--listen-address={DNS_ADDRESS}",
                               "--bind-interfaces", "--port=53", "--local-ttl=0", "--no-negcache", "--log-facility=-", "--user=root"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Listening, so its SIGHUP handler is in place (a SIGHUP before it would end dnsmasq).
    bound = "".join(f"{int(part):02X}" for part in reversed(DNS_ADDRESS.split("."))) + ":0035"
    assert wait_until(lambda: bound in Path("/proc/net/udp").read_text(), 10) and server.poll() is None

    def set_addresses(addresses: list[str]) -> None:
        hosts.write_text("".join(f"{address} {GATEWAY_NAME}\n" for address in addresses))
        server.send_signal(signal.SIGHUP)

    set_addresses.hosts = hosts
    yield set_addresses
    server.terminate()
    server.wait(10)


def test_the_dns_resolver_follows_the_gateways_the_name_has(dns, tmp_path):
    port = free_port()
    gateways = {address: Gateway(address, port) for address in ("127.0.0.1", "127.0.0.2", "127.0.0.3")}
    dns(list(gateways))
    agent_port = free_port()
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{agent_port}"}}}},
        "exporters": {"load_balancing": {"protocol": {"otlp": {"tls": {"insecure": True}, "timeout": "2s"}}, "routing_key": "service",
                                         "resolver": {"dns": {"hostname": GATEWAY_NAME, "port": str(port), "interval": "200ms"}}}},
        # (one worker: one resolver, whose changes the test reads in the log)
        "service": {"workers": 1, "pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["load_balancing"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "resolv.conf").write_text(f"nameserver {DNS_ADDRESS}\n")
    log = (tmp_path / "collector.log").open("w")
    # The collector asks the system's resolver, as Go's does: its /etc/resolv.conf names dnsmasq.
    collector = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
                                  f'mount --bind {tmp_path / "resolv.conf"} /etc/resolv.conf; exec "$0" --config "$1"',
                                  str(PYCOLLECTOR), str(tmp_path / "config.yaml")], stdout=log, stderr=subprocess.STDOUT)
    sent = 0
    try:
        assert wait_until(lambda: _listening(agent_port), 30), (tmp_path / "collector.log").read_text()

        def send(batch: int) -> None:
            nonlocal sent
            assert export_grpc(f"127.0.0.1:{agent_port}", profiles(SERVICES, 1, batch)).name == "OK"
            sent += len(SERVICES)

        everyone = list(gateways.values())
        assert wait_until(lambda: f"'127.0.0.3:{port}'" in (tmp_path / "collector.log").read_text(), 10), (tmp_path / "collector.log").read_text()
        send(0)
        assert wait_until(lambda: total(everyone) == sent), (total(everyone), sent)
        before = owners(everyone)
        assert all(len(found) == 1 for found in before.values()) and len({next(iter(found)) for found in before.values()}) == 3, before
        moved = {service for service, found in before.items() if f"127.0.0.2:{port}" in found}
        dns(["127.0.0.1", "127.0.0.3"])  # 127.0.0.2 leaves the name (it still runs)
        assert wait_until(lambda: f"backends=['127.0.0.1:{port}', '127.0.0.3:{port}']" in (tmp_path / "collector.log").read_text(), 10)
        already = gateways["127.0.0.2"].samples_by_service()
        send(1)
        assert wait_until(lambda: total(everyone) == sent), (total(everyone), sent)
        assert gateways["127.0.0.2"].samples_by_service() == already
        during = owners(everyone)
        assert all(len(during[service]) == 2 for service in moved) and all(during[s] == before[s] for s in set(SERVICES) - moved)
        dns(list(gateways))
        assert wait_until(lambda: (tmp_path / "collector.log").read_text().count(f"'127.0.0.2:{port}'") >= 2, 10)
        send(2)
        assert wait_until(lambda: total(everyone) == sent), (total(everyone), sent)
        assert set(gateways["127.0.0.2"].samples_by_service() - already) == moved
        output = (tmp_path / "collector.log").read_text()
        assert output.count("loadbalancing: backends") >= 3, output
    finally:
        collector.send_signal(signal.SIGINT)
        collector.wait(20)
        log.close()
        for gateway in gateways.values():
            gateway.kill()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


GO_CONFIG = """
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: localhost:4317
exporters:
  loadbalancing:
    routing_key: service
    protocol:
      otlp:
        timeout: 1s
        tls:
          insecure: true
    resolver:
      dns:
        hostname: otelcol-headless.observability.svc.cluster.local
        port: 4317
service:
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [loadbalancing]
"""


def test_a_go_config_validates_and_what_is_not_here_is_refused_by_name(tmp_path, cli):
    dns = "      dns:\n        hostname: otelcol-headless.observability.svc.cluster.local\n        port: 4317"
    for name, resolver, problem in (("go", dns, None),
                                    ("k8s", "      k8s:\n        service: lb-svc.kube-public\n        ports: [4317, 55690]\n        timeout: 1s", None),
                                    ("k8s-no-service", "      k8s:\n        ports: [4317]", "no service specified to resolve the backends"),
                                    ("aws", "      aws_cloud_map:\n        namespace: cloudmap", "aws_cloud_map: not supported by pycollector"),
                                    ("none", "      {}", "no resolvers specified for the exporter")):
        (tmp_path / f"{name}.yaml").write_text(GO_CONFIG.replace(dns, resolver))
        done = cli("validate", "--config", str(tmp_path / f"{name}.yaml"))
        if problem is None:
            assert done.returncode == 0, done.stdout + done.stderr
        else:
            assert done.returncode != 0 and problem in done.stdout + done.stderr, done.stdout + done.stderr


# -- the k8s resolver, against the fake API server of the k8sattributes tests ---------------------


def endpoint_slice(name: str, service: str, endpoints: list[tuple[str, bool | None]]) -> dict:
    """An EndpointSlice of ``service`` in namespace "observability": (address, ready) each, a
    ready of None leaving the condition out (which the API reads as ready)."""
    return {
        "metadata": {"name": name, "namespace": "observability", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {} if ready is None else {"ready": ready}} for address, ready in endpoints],
        "ports": [{"name": "otlp-grpc", "port": 4317, "protocol": "TCP"}],
    }


def test_the_k8s_resolver_follows_the_ready_endpoints_of_the_service(tmp_path, monkeypatch):
    from tests.test_k8sattributes_fake_api import FakeKubeApi

    port = free_port()
    gateways = {address: Gateway(address, port) for address in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}
    with FakeKubeApi(token="agent-token") as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": api.url}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "agent"}}],
            "users": [{"name": "agent", "user": {"token": "agent-token"}}],
        }))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        api.put("endpointslices", endpoint_slice("gateway-abc", "gateway", [("127.0.0.2", True), ("127.0.0.3", None), ("127.0.0.4", False)]))
        api.put("endpointslices", endpoint_slice("other-xyz", "other", [("127.0.0.9", True)]))
        exporter = balancer({"k8s": {"service": "gateway.observability", "ports": [port]}})
        try:
            assert exporter.resolver.endpoints == [f"127.0.0.2:{port}", f"127.0.0.3:{port}"]  # (listed before start returned)
            sent = 0
            for batch in range(3):
                exporter.consume(profiles(SERVICES, 1, batch))
                sent += len(SERVICES)
            assert wait_until(lambda: total(list(gateways.values())) == sent), (total(list(gateways.values())), sent)
            before = owners(list(gateways.values()))
            assert all(len(found) == 1 for found in before.values()) and {next(iter(found)) for found in before.values()} == {f"127.0.0.2:{port}", f"127.0.0.3:{port}"}
            # The third becomes ready, the first goes away: the watch moves the keys.
            api.put("endpointslices", endpoint_slice("gateway-abc", "gateway", [("127.0.0.3", True), ("127.0.0.4", True)]))
            assert wait_until(lambda: exporter.resolver.endpoints == [f"127.0.0.3:{port}", f"127.0.0.4:{port}"]), exporter.resolver.endpoints
            already = gateways["127.0.0.2"].samples_by_service()
            for batch in range(3, 6):
                exporter.consume(profiles(SERVICES, 1, batch))
                sent += len(SERVICES)
            assert wait_until(lambda: total(list(gateways.values())) == sent), (total(list(gateways.values())), sent)
            assert gateways["127.0.0.2"].samples_by_service() == already  # (no longer a backend)
            assert sum(gateways["127.0.0.4"].samples_by_service().values()) > 0
            # Every request carried the agent's token; only the gateway's slices were asked for.
            assert all(params.get("labelSelector") == "kubernetes.io/service-name=gateway" for params in api.requested("endpointslices"))
        finally:
            exporter.shutdown()
            for gateway in gateways.values():
                gateway.kill()


def test_the_k8s_resolver_names_the_pods_with_return_hostnames():
    from exporters.loadbalancing.config import K8sResolverSettings
    from exporters.loadbalancing.k8s_resolver import backends_of, service_and_namespace

    settings = K8sResolverSettings(service="gw", ports=[4317, 4318], return_hostnames=True)
    slices = [{"endpoints": [{"addresses": ["10.0.0.1"], "hostname": "gw-0"}, {"addresses": ["10.0.0.2"]},
                             {"addresses": ["10.0.0.3"], "hostname": "gw-2", "conditions": {"ready": False}}]}]
    assert backends_of(slices, settings, "gw", "obs") == ["gw-0.gw.obs:4317", "gw-0.gw.obs:4318"]
    assert backends_of([{"endpoints": [{"addresses": ["fd00::1"]}]}], K8sResolverSettings(service="gw"), "gw", "obs") == ["[fd00::1]:4317"]
    assert service_and_namespace("gw.obs") == ("gw", "obs")
    assert service_and_namespace("gw", Path("/nonexistent")) == ("gw", "default")
