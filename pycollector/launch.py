"""The ``pycollector`` command: its CPU priority first (pycollector.priority), then the rest."""

from __future__ import annotations

import sys

from pycollector import priority


def main() -> int:
    raised = priority.raise_early()  # (before the imports, which a saturated host makes seconds long)
    from pycollector import cli

    return cli.main(raised_priority=raised)


if __name__ == "__main__":
    sys.exit(main())
