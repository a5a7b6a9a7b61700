"""What each process of a multi-worker collector runs, cut from the one validated plan.

Workers run the pipelines and the extensions placed in them (``Factory.placement``: each worker,
or the first only); the supervisor runs the extensions that answer for the whole (health_check)
and serves the one metrics page. Workers serve no metrics of their own: the supervisor asks them.
"""

from __future__ import annotations

import dataclasses

from pycollector.component import EACH_WORKER, FIRST_WORKER, SUPERVISOR, WorkerSlot
from pycollector.config.validate import Plan


def _placement(plan: Plan, extension: str) -> str:
    return getattr(plan.component("extensions", extension).factory, "placement", EACH_WORKER)


def worker_plan(plan: Plan, slot: WorkerSlot) -> Plan:
    wanted = {EACH_WORKER} | ({FIRST_WORKER} if slot.index == 0 else set())
    extensions = [name for name in plan.extensions if _placement(plan, name) in wanted]
    return _with_extensions(plan, extensions, pipelines=plan.pipelines, metrics=False)


def supervisor_plan(plan: Plan) -> Plan:
    extensions = [name for name in plan.extensions if _placement(plan, name) == SUPERVISOR]
    return _with_extensions(plan, extensions, pipelines={}, metrics=True)


def _with_extensions(plan: Plan, extensions: list[str], pipelines: dict, metrics: bool) -> Plan:
    kept = set(extensions)
    components = {key: spec for key, spec in plan.components.items()
                  if (key[0] == "extensions" and key[1] in kept) or (key[0] != "extensions" and pipelines)}
    telemetry = plan.telemetry
    if not metrics:
        telemetry = telemetry.model_copy(update={"metrics": telemetry.metrics.model_copy(update={"level": "none"})})
    return dataclasses.replace(plan, components=components, pipelines=pipelines, extensions=extensions, telemetry=telemetry)
