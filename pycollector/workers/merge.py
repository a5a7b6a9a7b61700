"""One metrics page for a collector of several worker processes: the workers' series added up.

A counter or a histogram of the whole is the sum of the workers' (items accepted, bytes sent),
and so is a gauge of what each holds (queue sizes, memory, CPU seconds): the page reads as a lone
collector's would, with the Go collector's names. Uptime is the supervisor's, the oldest process.
"""

from __future__ import annotations

from prometheus_client.core import Metric

# Series whose whole is the longest of the processes', not their sum.
LONGEST = frozenset({"otelcol_process_uptime"})


def merged_families(per_process: list[list[tuple]]) -> list[Metric]:
    """Families as worker.metric_families gives them, from several processes -> Metric objects
    with every series (name and labels) summed (or, for LONGEST, the largest)."""
    families: dict[str, tuple[str, str, str]] = {}
    values: dict[str, dict[tuple, float]] = {}
    for process in per_process:
        for name, kind, documentation, unit, samples in process:
            families.setdefault(name, (kind, documentation, unit))
            series = values.setdefault(name, {})
            for sample_name, labels, value in samples:
                key = (sample_name, tuple(sorted(labels.items())))
                if key not in series:
                    series[key] = value
                elif name in LONGEST:
                    series[key] = max(series[key], value)
                else:
                    series[key] += value
    merged = []
    for name, (kind, documentation, unit) in families.items():
        metric = Metric(name, documentation, kind, unit)
        for (sample_name, labels), value in values[name].items():
            metric.add_sample(sample_name, dict(labels), value)
        merged.append(metric)
    return merged
