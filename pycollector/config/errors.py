"""Config errors: every message starts with the path of the offending value."""

from __future__ import annotations


def join_path(*parts: object) -> str:
    return "::".join(str(part) for part in parts if part != "")


class ConfigError(Exception):
    """One or more problems with the configuration, reported together."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))

    def __str__(self) -> str:
        count = len(self.problems)
        header = "invalid configuration: 1 problem" if count == 1 else f"invalid configuration: {count} problems"
        return header + "\n" + "\n".join(f"  - {problem}" for problem in self.problems)
