"""Plugin discovery with real distributions: a dist-info directory and a module on the path, as
pip lays them out, seen by the installed ``pycollector`` in a subprocess."""

import os
import socket
import textwrap

import yaml

from tests.conftest import run_cli

FACTORY = textwrap.dedent(
    """
    from pycollector.component import Component, Factory

    class RivalFactory(Factory):
        type = "debug"
        def create(self, settings, config, next_consumer):
            return Component()

    factory = RivalFactory()
    """
)


def distribution(root, name, entry_points, modules):
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    return root


def with_path(root):
    return {**os.environ, "PYTHONPATH": str(root)}


def config(tmp_path, exporter):
    path = tmp_path / "config.yaml"
    path.write_text(
        f"receivers: {{profiling: {{}}}}\nexporters: {{{exporter}: {{}}}}\n"
        f"service: {{pipelines: {{profiles: {{receivers: [profiling], exporters: [{exporter}]}}}}}}\n"
    )
    return str(path)


def test_a_plugin_that_fails_to_import_is_named_with_its_distribution(tmp_path):
    root = distribution(tmp_path / "site", "broken-plugin", "[pycollector.exporters]\nbroken = broken_plugin:factory\n", {"broken_plugin": "import not_installed_dependency\n"})
    listing = run_cli("components", env=with_path(root))
    assert listing.returncode == 0
    assert (
        "broken plugin: exporters::broken: plugin failed to import (entry point 'broken = broken_plugin:factory' in group "
        "'pycollector.exporters' of distribution broken-plugin 1.0): ModuleNotFoundError: No module named 'not_installed_dependency'"
    ) in listing.stderr
    assert "debug" in listing.stdout  # the others are still listed
    # A config that does not name it never imports it.
    assert run_cli("validate", "--config", config(tmp_path, "debug"), env=with_path(root)).returncode == 0
    named = run_cli("validate", "--config", config(tmp_path, "broken"), env=with_path(root))
    assert named.returncode == 1 and "exporters::broken: plugin failed to import" in named.stderr


def test_two_plugins_claiming_one_name_is_an_error(tmp_path):
    root = distribution(tmp_path / "site", "rival", "[pycollector.exporters]\ndebug = rival_debug:factory\n", {"rival_debug": FACTORY})
    result = run_cli("validate", "--config", config(tmp_path, "debug"), env=with_path(root))
    assert result.returncode == 1
    assert "exporters::debug: type 'debug' is claimed by more than one plugin:" in result.stderr
    assert "distribution pycollector 0.1.0" in result.stderr and "distribution rival 1.0" in result.stderr


def test_a_deprecated_alias_works_and_is_logged_once(tmp_path):
    root = distribution(tmp_path / "site", "aliases", "[pycollector.exporters]\nold_debug = exporters.debug.factory:factory\n", {})
    path = tmp_path / "two.yaml"
    path.write_text(
        "receivers: {profiling: {}}\nexporters: {old_debug: {}, old_debug/2: {}}\n"
        "service:\n  telemetry: {metrics: {level: none}}\n  pipelines: {profiles: {receivers: [profiling], exporters: [old_debug, old_debug/2]}}\n"
    )
    result = run_cli("validate", "--config", str(path), env=with_path(root))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("'old_debug' is a deprecated name; use 'debug'") == 1
    assert "used_in='exporters::old_debug, exporters::old_debug/2'" in result.stderr
    # `components` lists the component once, by its current name, as the Go collector does.
    listing = yaml.safe_load(run_cli("components", env=with_path(root)).stdout)
    names = [entry["name"] for entry in listing["exporters"]]
    assert "debug" in names and "old_debug" not in names


def test_failed_start_exits_non_zero_with_the_reason(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = tmp_path / "c.yaml"
        path.write_text(
            "receivers: {profiling: {}}\nexporters: {debug: {}}\n"
            f"service:\n  telemetry: {{metrics: {{address: '127.0.0.1:{port}'}}}}\n  pipelines: {{profiles: {{receivers: [profiling], exporters: [debug]}}}}\n"
        )
        result = run_cli("--config", str(path), "--log-format", "json")
    assert result.returncode == 1
    assert "could not start" in result.stderr and f"service::telemetry::metrics: cannot listen on 127.0.0.1:{port}" in result.stderr


def test_feature_gates_are_accepted():
    result = run_cli("validate", "--feature-gates", "service.profilesSupport", "--config", "configs/default.yaml")
    assert result.returncode == 0, result.stderr
