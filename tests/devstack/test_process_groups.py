"""A child process group started by jitserve.devstack.vllm.start_process dies with the
process that started it, however that one dies (here: SIGKILL, which nothing can catch),
so a killed test run or `jitserve up` leaves no vLLM behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.support.processes import alive
from tests.support.waiting import wait_until

STARTER = """
import sys, time
from jitserve.devstack import vllm as vl
# a leader with a child of its own, as vLLM's API server has its engine core
child = vl.start_process(["sh", "-c", "sleep 600 & sleep 600; wait"], None)
print(child.pid, flush=True)
time.sleep(600)
"""



def test_a_killed_parent_takes_its_children_with_it() -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE)
    assert starter.stdout is not None
    leader = int(starter.stdout.readline())
    assert alive(leader, group=True)
    starter.send_signal(signal.SIGKILL)
    starter.wait(30)
    wait_until("the orphaned group to be killed", lambda: not alive(leader, group=True), 60)


def test_a_normal_stop_leaves_no_watchdog_behind() -> None:
    from jitserve.devstack import vllm as vl

    proc = vl.start_process(["sleep", "600"], None)
    vl.stop_process(proc)
    # Its command line ends with these three words; a substring test would also match a
    # watchdog of a pid that begins with proc.pid's digits.
    mine = ["jitserve-watchdog", str(os.getpid()), str(proc.pid)]

    def gone() -> bool:
        listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        return all(line.split()[-3:] != mine for line in listing.splitlines())

    wait_until("its watchdog to exit", gone, 60)
