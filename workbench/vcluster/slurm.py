"""A Slurm across a virtual cluster: slurmctld on the head, one slurmd on every node.

:class:`~workbench.vcluster.slurm_local.LocalSlurm` with the cluster's machines: each node is
a ``SlurmNode`` (NodeName = its hostname, NodeAddr = its address, slurmd started inside its
namespaces with ``nsenter``, which keeps the host's ``/sys``: ``ip netns exec`` remounts it and
slurmd then finds no cgroup file system). slurmctld runs in the head's own UTS and mount
namespaces, where the head is called ``NAME-head`` and that name resolves to its bridge address:
with ``NoCtldInAddrAny,NoInAddrAny`` every daemon and client binds the address its host's name
resolves to, so slurmctld listens on the bridge (never on all interfaces) and srun, run through the
cluster's wrappers (``workbench vcluster env``), opens its own ports there too, where the nodes'
slurmstepd reach them. Its files (slurm.conf, the munge socket, spool, logs) are under
``/run/workbench-vcluster-slurm/NAME``, which every node sees. Root only: the daemons run as root and start job steps as their users.

Settings beside the single-node Slurm's: ``MpiDefault=pmi2`` (one MPI job per srun without
``--mpi``), ``SlurmdTimeout=10`` (a node whose slurmd is gone is DOWN within about 25 s and its
jobs fail; ``JobRequeue=0``: they are not run again), ``KillWait=30`` (Slurm's default), a ``TaskProlog`` giving every task the cluster's MPI transport (``MPI_ENV``). The
daemons outlive the process that started them (``workbench vcluster up --slurm`` exits); ``down``
stops them.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .slurm_local import LocalSlurm, SlurmNode, SlurmUnavailable, leftover_pids
from ..runtime.processes import stop_processes
from . import tools, wiring
from .tools import VirtualClusterError

#: seconds after which slurmctld marks a node whose slurmd does not answer DOWN (its jobs then fail)
SLURMD_TIMEOUT = 10
#: seconds from SIGTERM to SIGKILL when Slurm ends a job early (Slurm's default): `workbench train` in a
#: batch job that lost a node needs a few of them to record the run as failed, naming the node
KILL_WAIT = 30
#: where each cluster's Slurm keeps its files: seen by every node (not under /tmp), and on a path every
#: user may traverse (munged refuses a socket under a folder such as /root)
SLURM_ROOT = Path("/run/workbench-vcluster-slurm")


def root_of(vc):
    return SLURM_ROOT / vc.name


def slurm_of(vc) -> LocalSlurm:
    """The LocalSlurm object of ``vc``'s Slurm (not started)."""
    head = (tools.tool("nsenter"), f"--uts={wiring.ns_file(vc.plan, 'head', 'uts')}",
            f"--mount={wiring.ns_file(vc.plan, 'head', 'mnt')}", "--wd=/", "--")
    nodes = [SlurmNode(vc.plan.hostname(i), vc.plan.address(i), tuple(vc.enter(i, cwd="/"))) for i in range(vc.nodes)]
    SLURM_ROOT.mkdir(mode=0o755, exist_ok=True)
    slurm = LocalSlurm(root_of(vc), mpi_default="pmi2", nodes=nodes,
                       controller=SlurmNode(vc.plan.head_hostname, vc.head_address, head), detached=True,
                       slurmd_timeout=SLURMD_TIMEOUT, task_env=vc.mpi_env(), kill_wait=KILL_WAIT)
    slurm.cluster = f"wbv{vc.name}"
    return slurm


def start_slurm(vc, timeout: float = 60.0) -> LocalSlurm:
    """Start ``vc``'s Slurm and wait until every node is idle (VirtualClusterError otherwise)."""
    if os.geteuid() != 0:
        raise VirtualClusterError("slurm: Slurm's daemons run as root (slurmd starts job steps as their users)")
    slurm = slurm_of(vc)
    try:
        slurm.start(timeout=timeout)
    except SlurmUnavailable as exc:
        raise VirtualClusterError(f"vcluster {vc.name}: Slurm did not start: {exc}") from None
    return slurm


def stop_slurm(vc) -> None:
    """Stop ``vc``'s Slurm from this or any other process: cancel its jobs, end its daemons and
    job steps (on the host: munged; on the head and the nodes: everything, by namespace), remove
    its files."""
    slurm = getattr(vc, "_slurm", None) or slurm_of(vc)
    if slurm._procs:
        slurm.stop()
    else:
        root = slurm.root
        if (root / "slurm.conf").exists():
            try:
                slurm.run(["scancel", "--partition=debug"], timeout=10)
            except Exception:  # noqa: BLE001 - the controller is gone already
                pass
        stop_processes(leftover_pids(root, slurm.cluster), grace=5, kill_wait=5.0)
    wiring.kill_processes(vc.plan)
    shutil.rmtree(root_of(vc), ignore_errors=True)


def restart_slurmd(vc, node: int) -> None:
    """Start ``node``'s slurmd again (after a fault killed it); the node returns to service."""
    slurm = getattr(vc, "_slurm", None) or slurm_of(vc)
    slurm.start_slurmd(slurm.nodes[node])


def slurmd_pid(vc, node: int) -> int | None:
    """The pid of ``node``'s slurmd, from its pid file."""
    try:
        return int((root_of(vc) / f"slurmd-{vc.plan.hostname(node)}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
