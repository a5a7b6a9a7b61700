"""A figure of the results table: pycollector's per-round values against a peer's from the same
rounds, summarised as median and spread, with the per-round ratio."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence


@dataclasses.dataclass
class Summary:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Summary":
        finite = [value for value in values if math.isfinite(value)]
        if not finite:
            return cls(math.nan, math.nan, math.nan)
        return cls(statistics.median(finite), min(finite), max(finite))

    def show(self, style: str) -> str:
        if math.isnan(self.median):
            return "n/a"
        if self.low == self.high:
            return style.format(self.median)
        return f"{style.format(self.median)} [{style.format(self.low)}–{style.format(self.high)}]"


@dataclasses.dataclass
class Row:
    section: str
    figure: str
    ours: list[float]  # one value per round
    peer: str
    theirs: list[float]  # the peer's value in the same rounds
    style: str  # format of one value, e.g. "{:.3f}"
    # Given the summaries of ours, theirs and the ratio, says whether a target is met and by how much.
    target: Callable[[Summary, Summary, Summary], str] | None = None

    def ratios(self) -> list[float]:
        return [a / b if b else math.nan for a, b in zip(self.ours, self.theirs)]

    def cells(self) -> list[str]:
        ours, theirs, ratio = Summary.of(self.ours), Summary.of(self.theirs), Summary.of(self.ratios())
        verdict = self.target(ours, theirs, ratio) if self.target else ""
        return [self.section, self.figure, ours.show(self.style), self.peer, theirs.show(self.style), ratio.show("{:.3f}"), verdict]


def per_round(runs: list, mode: str, figure: str) -> list[float]:
    """One mode's values of one figure (a key of ``rounds.Run.figures``), in round order."""
    return [run.figures[figure] for run in sorted(runs, key=lambda run: run.round) if run.mode == mode]
