"""An agent's CPU priority: a collector that profiles the host runs at AGENT_NICE.

On a host whose CPUs are saturated, a process at the default priority gets its fair share and
no more: with 40 busy processes on 2 CPUs, a twentieth of a CPU. The agent needs about 1% of
one, but at the moments it needs it: its start (Python's imports, the BPF program, every
process's maps and runtimes: 17 to 20 s there at nice 0, 2.8 s at nice -10) and each new
process's maps, read when the kernel announces it (a short process's samples before that cannot
be walked). Taking its 1% first costs the others nothing they would notice.

``pycollector`` raises its priority first thing (``raise_early``, before the imports), and
``settle`` puts it back once the config says the collector profiles nothing (a gateway's workers
run at the priority it was started with). Only from the default priority: a nice the operator
chose (a unit's Nice=, ``nice -n``) is left as it is. Raising needs root or CAP_SYS_NICE (lowering
it back needs nothing); without, the agent says so once and runs as it is.
"""

from __future__ import annotations

import os
from typing import Any

AGENT_NICE = -10
DEFAULT_NICE = 0
PROFILING = "profiling"


def raise_early() -> bool:
    """AGENT_NICE from the default priority, if this process may; whether it did."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != DEFAULT_NICE:
            return False
        os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)
    except OSError:
        return False
    return True


def profiles_the_host(config: dict) -> bool:
    receivers = config.get("receivers") if isinstance(config, dict) else None
    return isinstance(receivers, dict) and any(str(name).split("/", 1)[0] == PROFILING for name in receivers)


def settle(config: dict, raised: bool, log: Any) -> None:
    """Once the config is read: back to the default unless it profiles the host; an agent that
    could not raise its priority says what would."""
    agent = profiles_the_host(config)
    if raised and not agent:
        os.setpriority(os.PRIO_PROCESS, 0, DEFAULT_NICE)  # (lowering one's priority needs no privilege)
    elif agent and not raised and os.getpriority(os.PRIO_PROCESS, 0) == DEFAULT_NICE:
        log.info("running at the default CPU priority: on a saturated host the agent's start and its reading of new "
                 "processes wait for CPU (give it Nice=-10 in its unit, or CAP_SYS_NICE; in Kubernetes its CPU request "
                 "weighs its share)")
