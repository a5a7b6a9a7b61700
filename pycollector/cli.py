"""Command line, shaped like the Go collector's: run, validate, components, print-config."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Sequence

import yaml

from pycollector import logs, priority, process_memory
from pycollector.component import KINDS, StartError
from pycollector.config import ConfigError, load
from pycollector.config.providers import SCHEMES
from pycollector.config.redact import redacted
from pycollector.config.types import UNREDACTED
from pycollector.config.validate import Plan, build_plan
from pycollector.registry import PluginError, Registry
from pycollector.workers.count import worker_count

# Gates the Go collector needs for profiles; here profiles are always on, so they are accepted.
KNOWN_FEATURE_GATES = {"service.profilesSupport": "profiles pipelines (always enabled in pycollector)"}


def _common_flags() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", action="append", default=None, metavar="URI",
                        help="YAML config: a file, or file:PATH, env:VAR, yaml:TEXT, http(s)://URL; repeat to deep-merge several (later wins)")
    common.add_argument("--set", action="append", default=None, metavar="KEY=VALUE", help="override one value, e.g. --set exporters::debug::verbosity=detailed")
    common.add_argument("--feature-gates", action="append", default=None, metavar="GATES",
                        help="comma-separated gates, e.g. service.profilesSupport; an unknown gate is an error, as in the Go collector")
    common.add_argument("--log-format", choices=("console", "json"), default=None, help="console for people (default), json for machines")
    common.add_argument("--log-level", choices=("debug", "info", "warn", "error"), default=None)
    return common


def _parser() -> argparse.ArgumentParser:
    common = _common_flags()
    parser = argparse.ArgumentParser(prog="pycollector", parents=[common], description="Run telemetry pipelines declared like the OpenTelemetry Collector's.")
    # As the Go collector's: "<command> version <version>" on stdout.
    parser.add_argument("--version", "-v", action="version", version=f"pycollector version {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("validate", parents=[common], help="check the config and build the pipeline graph without starting anything")
    commands.add_parser("components", parents=[common], help="list every installed component factory")
    printer = commands.add_parser("print-config", parents=[common], help="print the resolved config")
    printer.add_argument("--with-defaults", action="store_true", help="show every component's settings, defaults included")
    # The Go collector's flag and spellings (otelcol print-config --mode).
    printer.add_argument(
        "--mode", type=str.lower, choices=("redacted", "unredacted"), default="redacted",
        help="redacted (default): opaque values (header values, tokens, passwords, keys) print as [REDACTED]; unredacted: as they are",
    )
    # Commands components bring (`pycollector diff`, from the flame graph exporter), found as
    # components are: by entry point, so the engine imports no component.
    for command in plugin_commands().values():
        command.add_arguments(commands.add_parser(command.name, help=command.help))
    return parser


COMMANDS_GROUP = "pycollector.commands"


def plugin_commands() -> dict:
    """{name: command} of the installed distributions' ``pycollector.commands`` entry points:
    objects with ``name``, ``help``, ``add_arguments(parser)`` and ``run(args) -> int``."""
    from importlib.metadata import entry_points

    found = {}
    for entry_point in entry_points(group=COMMANDS_GROUP):
        try:
            command = entry_point.load()
        except Exception as error:  # noqa: BLE001 - a broken plugin must not take the CLI down
            print(f"pycollector: command {entry_point.name!r} could not be loaded: {error}", file=sys.stderr)
            continue
        found[command.name] = command
    return found


def _merge_flags(args: argparse.Namespace) -> None:
    """Flags given before and after the subcommand both count (argparse keeps only one set)."""
    for name in ("config", "set", "feature_gates"):
        setattr(args, name, getattr(args, name) or [])


def main(argv: Sequence[str] | None = None, raised_priority: bool = False) -> int:
    """``raised_priority``: the command raised its CPU priority before importing this
    (pycollector.launch), to keep only if the config profiles the host."""
    process_memory.limit_heaps()
    args = _parser().parse_args(argv)
    _merge_flags(args)
    logs.configure(args.log_format or "console", args.log_level or "info")
    log = logs.get_logger(component="cli")
    unknown = _check_feature_gates(args.feature_gates, log)
    if unknown:
        # The Go collector's words, so scripts that match them keep working.
        print(f'Error: invalid argument "{unknown[0]}" for "--feature-gates" flag: no such feature gate "{unknown[1]}". '
              f"valid gates: [{' '.join(sorted(KNOWN_FEATURE_GATES))}]", file=sys.stderr)
        return 1
    if args.command == "components":
        return _components()
    commands = plugin_commands()
    if args.command in commands:
        return commands[args.command].run(args)
    if not args.config:
        print("pycollector: no config given; use --config FILE (e.g. --config configs/default.yaml)", file=sys.stderr)
        return 2
    try:
        config = load(args.config, args.set, warn=lambda message: log.warning(message))
        priority.settle(config, raised_priority, log)
        # print-config validates too: which values are secrets is known from the models.
        plan = build_plan(config, Registry())
        if args.command == "print-config":
            print(yaml.safe_dump(_printable(config, plan, args.with_defaults, args.mode == "unredacted"), sort_keys=False), end="")
            return 0
        if args.command == "validate":
            from pycollector.graph import Graph
            from pycollector.service import log_deprecated_names
            from pycollector.telemetry import Telemetry

            log_deprecated_names(plan, log)
            graph = Graph(plan, Telemetry())
            pipelines = len(plan.pipelines)
            print(f"{', '.join(args.config)}: valid ({pipelines} pipeline{'s' * (pipelines != 1)}, {len(graph.nodes)} component instances)")
            return 0
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return 1
    # The config's service::telemetry::logs applies where the command line did not say otherwise.
    log_format, log_level = args.log_format or plan.telemetry.logs.encoding or "console", args.log_level or plan.telemetry.logs.level.lower()
    logs.configure(log_format, log_level)
    try:
        workers, why = worker_count(plan)
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return 1
    if workers > 1:
        from pycollector.workers.supervisor import Supervisor

        log.info("running the pipelines in worker processes", workers=workers, why=why)
        return Supervisor(plan, config, workers, log_format, log_level).run()
    return _run(plan)


def _run(plan: Plan) -> int:
    from pycollector.service import Service

    log = logs.get_logger(component="service")
    try:
        service = Service(plan)
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return 1

    def stop(signum, _frame):
        log.info("stopping", signal=signal.Signals(signum).name)
        service.request_stop()
        # A second Ctrl-C while shutting down interrupts the shutdown itself.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        service.start()
    except StartError as error:
        log.error("could not start", reason=str(error))
        return 1
    while not service.wait(0.5):
        pass
    service.shutdown()
    if service.fatal_error is not None:
        source, error = service.fatal_error
        log.error("stopped after a fatal error", source=source, error=str(error))
        return 1
    log.info("stopped cleanly")
    return 0


def _check_feature_gates(values: list[str], log) -> tuple[str, str] | None:
    """(the flag's value, the gate) of the first unknown gate, else None; known gates asked to be
    switched off are warned about (their feature is always on here)."""
    for value in values:
        for gate in filter(None, (part.strip() for part in value.split(","))):
            name = gate.lstrip("+-")
            if name not in KNOWN_FEATURE_GATES:
                return value, name
            if gate.startswith("-"):
                log.warning("feature gate cannot be disabled here", gate=name, reason=KNOWN_FEATURE_GATES[name])
    return None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pycollector")
    except PackageNotFoundError:  # (run from a source tree that was never installed)
        return "unknown"


# What `components` prints each kind's stability under, as the Go collector names them (which
# leaves profiles out; here they are printed too, as most of our components are profiles-only).
STABILITY_KEYS = {
    "receivers": ("logs", "metrics", "traces", "profiles"),
    "processors": ("logs", "metrics", "traces", "profiles"),
    "exporters": ("logs", "metrics", "traces", "profiles"),
    "connectors": tuple(f"{a}-to-{b}" for a in ("logs", "metrics", "traces") for b in ("logs", "metrics", "traces")) + ("profiles-to-profiles",),
    "extensions": ("extension",),
}


def _components() -> int:
    """Every installed component, in the Go collector's `components` YAML: build info, each kind's
    components by type (deprecated names left out, as Go leaves them out) with the distribution
    that brings them and their stability per signal, and the config providers."""
    registry = Registry()
    document: dict = {"buildinfo": {"command": "pycollector", "description": "OpenTelemetry-Collector-style telemetry pipeline (continuous eBPF profiling)",
                                    "version": _version()}}
    broken = []
    for kind in KINDS:
        by_type: dict[str, dict] = {}
        for info in registry.plugins(kind):
            try:
                factory = registry.load(kind, info.name).factory
            except PluginError as error:
                broken.append(f"{kind}::{info.name}: {error}")
                continue
            by_type.setdefault(factory.type, {"name": factory.type, "module": info.distribution,
                                              "stability": _stability(kind, factory)})
        document[kind] = [by_type[type_] for type_ in sorted(by_type)]
    document["providers"] = [{"scheme": scheme, "module": f"pycollector {_version()}"} for scheme in sorted(SCHEMES)]
    print(yaml.dump(document, Dumper=_GoStyleDumper, sort_keys=False, width=1000, allow_unicode=True), end="")
    for line in broken:
        print(f"broken plugin: {line}", file=sys.stderr)
    return 0


def _stability(kind: str, factory) -> dict[str, str]:
    level = factory.stability
    if kind == "extensions":
        return {"extension": level}
    if kind == "connectors":
        return {key: level if key.split("-to-")[0] == key.split("-to-")[1] and key.split("-to-")[0] in factory.signals else "Undefined"
                for key in STABILITY_KEYS[kind]}
    return {key: level if key in factory.signals else "Undefined" for key in STABILITY_KEYS[kind]}


class _GoStyleDumper(yaml.SafeDumper):
    """Lists indented under their key, as Go's YAML library writes them."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _printable(config: dict, plan: Plan, with_defaults: bool, unredacted: bool) -> dict:
    """The config print-config shows: as resolved, or with every default; secrets redacted
    unless asked otherwise (as the Go collector's print-config --mode unredacted)."""
    if not with_defaults:
        return config if unredacted else redacted(config, plan)
    resolved = redacted(config, plan) if not unredacted else dict(config)
    context = UNREDACTED if unredacted else None
    for (kind, component_id), spec in plan.components.items():
        resolved.setdefault(kind, {})[component_id] = spec.config.model_dump(mode="json", by_alias=False, context=context)
    return resolved


if __name__ == "__main__":
    sys.exit(main())
