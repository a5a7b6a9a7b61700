"""pycollector/priority.py: an agent runs at nice -10 when it may, from its first instant; a
collector that profiles nothing goes back to the priority it was started with; a priority the
operator chose is left alone; one that cannot raise it says what would."""

from __future__ import annotations

import os
import subprocess

import pytest

from pycollector.priority import AGENT_NICE, profiles_the_host

SNIPPET = """
import os, sys
from pycollector import priority
raised = priority.raise_early()
during = os.getpriority(os.PRIO_PROCESS, 0)
class Log:
    def info(self, event, **fields): print("said:", event)
priority.settle({"receivers": {sys.argv[1]: {}}}, raised, Log())
print(raised, during, os.getpriority(os.PRIO_PROCESS, 0))
"""


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(receiver: str, prefix: tuple[str, ...] = ()) -> list[str]:
    """The snippet in a process of its own (a priority raised here would stay with the tests),
    by Debian's python (which an unprivileged user may run; the module needs nothing else)."""
    done = subprocess.run([*prefix, "/usr/bin/python3", "-c", SNIPPET, receiver], capture_output=True, text=True, timeout=60,
                          cwd="/", env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_which_configs_profile_the_host():
    assert profiles_the_host({"receivers": {"profiling": {}, "otlp": {}}}) and profiles_the_host({"receivers": {"profiling/node": None}})
    assert not profiles_the_host({"receivers": {"otlp": {}}}) and not profiles_the_host({}) and not profiles_the_host({"receivers": []})


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority needs root or CAP_SYS_NICE")
def test_an_agent_keeps_the_raised_priority_and_a_gateway_goes_back():
    assert run("profiling") == [f"True {AGENT_NICE} {AGENT_NICE}"]
    assert run("otlp") == [f"True {AGENT_NICE} 0"]


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv and nice -n need root here")
def test_a_chosen_priority_is_left_and_an_unprivileged_agent_says_what_would_raise_it():
    assert run("profiling", ("nice", "-n", "5")) == ["False 5 5"]
    unprivileged = run("profiling", ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"))
    assert unprivileged[-1] == "False 0 0" and "Nice=-10" in unprivileged[0], unprivileged
