"""The rootless virtual cluster's *holder* (:mod:`workbench.vcluster.rootless`): the process that
``unshare`` starts inside a new user, network and mount namespace (root there). It mounts its own
``/run``, builds the cluster there exactly as root does, says so in ``READY_FILE`` and sleeps until
killed; the cluster's namespaces live as long as it does::

    python -m workbench.vcluster.holder PLAN_JSON READY_FILE
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from . import tools
from .cluster import VirtualCluster
from .plan import Plan


def hold(plan_json: str, ready: str) -> int:
    """The holder: inside a new user, network and mount namespace (root there), give the cluster
    its own ``/run``, build it, tell ``ready`` and sleep until killed."""
    tools.run(["mount", "-t", "tmpfs", "-o", "mode=755", "wbvrun", "/run"], "mount the holder's /run")
    Path("/run/netns").mkdir()
    tools.run(["ip", "link", "set", "dev", "lo", "up"], "the head's loopback")
    plan = Plan.from_dict(json.loads(plan_json))
    vc = VirtualCluster(plan.name, plan.nodes, plan.topology, plan.bandwidth, plan.latency, shared=plan.shared,
                        queue=plan.queue, keep=True)
    vc.up()
    Path(ready).write_text(json.dumps({**vc.record, "up_seconds": vc.up_seconds}))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    while True:
        signal.pause()



if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m workbench.vcluster.holder PLAN_JSON READY_FILE", file=sys.stderr)
        sys.exit(2)
    sys.exit(hold(sys.argv[1], sys.argv[2]))
