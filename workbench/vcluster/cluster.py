"""``wb.VirtualCluster``: N nodes as Linux namespaces joined by shaped links, on this machine.

    with wb.VirtualCluster("vc", nodes=4, topology="switch", bandwidth="100mbit") as vc:
        vc.exec(0, ["hostname"])                       # vc-0
        vc.mpiexec_args(8, ppn=2)                      # hydra across the nodes, UCX over TCP
        with wb.Cluster(n=4, vcluster=vc) as cluster:  # ipyparallel engines on the nodes
            ...
    VirtualCluster.attach("vc")                        # one that `workbench vcluster up vc` made

The head (the "login node") is this host: the notebook kernel, the CLI and the servers the nodes
must reach, which listen on the head's address on the cluster's bridge (:attr:`head_address`).
What a node is and how it is wired: :mod:`workbench.vcluster.wiring`; names and addresses:
:mod:`workbench.vcluster.plan`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from .. import mpilib
from ..mpilib import MPIFlavour
from ..paths import state_dir
from . import registry, tools, wiring
from .plan import PREFIX, Plan, PlanError, format_rate
from .faults import Faults
from .wiring import VirtualClusterError

#: the environment of MPI ranks on the nodes: MPICH's libfabric netmod with its TCP provider on the
#: node's eth0. MPICH's default, UCX, also reaches the network here (each node has its own /dev/shm
#: and SysV IPC, so its shared-memory transports cannot join two nodes; where namespaces share them,
#: UCX passes messages through the host's memory and nearly nothing crosses the links), but its
#: TCP rendezvous protocol left large all-reduces far below the link's bound where libfabric's TCP came
#: close to it. Ranks of one node still meet in MPICH's own shared memory.
MPI_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0",
           "GLOO_SOCKET_IFNAME": "eth0"}


class VirtualCluster(Faults):
    """A virtual cluster: ``nodes`` Linux namespaces on this machine joined by links shaped to ``bandwidth``;
    nothing is built until :meth:`up` (or ``with``).

    Args:
        name: 1-8 characters, a lower-case letter then letters or digits; its nodes are ``NAME-0``, ...
        nodes: how many nodes (1..252).
        topology: ``switch``, ``ring``, ``torus:RxC``, ``mesh:RxC`` or ``fully_connected``.
        bandwidth: every link's rate: ``"100mbit"``, ``"1gbit"`` (tc's units), or bits per second.
        latency: added per link where the kernel has netem: ``"50us"``, ``"1ms"``, or seconds.
        slurm: a Slurm whose slurmd runs on every node.
        shared: the cluster's shared folder, mounted on every node at the same path (default
            ``$WORKBENCH_STATE_DIR/vcluster/NAME/shared``).
        queue: bytes each link may queue (``"128K"``, ``"1M"``; default 5 ms at the rate, at least 128 KiB:
            small queues drop packets when several nodes send to one, large ones delay MPI's control
            messages behind data).
        keep: leave it up when the ``with`` block ends (else removed; one whose owner died: by the next ``up``).

    Raises:
        PlanError: a name, node count, topology, rate, latency or queue that is not allowed (one line).

    Attributes:
        plan (Plan): what :meth:`up` builds: names, addresses, links; ``record``: its record while up.
        up_seconds (float | None): seconds :meth:`up` took (None before, and for an attached cluster).
    """

    def __init__(self, name: str = "vc", nodes: int = 4, topology: str = "switch", bandwidth: str | int = "1gbit",
                 latency: str | float | None = None, *, slurm: bool = False, shared: str | os.PathLike | None = None,
                 queue: str | int | None = None, keep: bool = False) -> None:
        shared = Path(shared).absolute() if shared else state_dir().absolute() / "vcluster" / str(name) / "shared"
        self.plan = Plan(name, nodes, topology, bandwidth, latency, slurm, shared=str(shared), queue=queue)
        self.keep = keep
        self.record: dict | None = None
        self.up_seconds: float | None = None
        self._slurm = None

    # -- life -------------------------------------------------------------------------------
    @classmethod
    def attach(cls, name: str) -> "VirtualCluster":
        """The running cluster called ``name`` (made by ``workbench vcluster up`` or another process), kept up
        when a ``with`` block ends; PlanError for a name no cluster can have, VirtualClusterError when no
        cluster of that name is up."""
        from .plan import check_name
        from . import rootless
        check_name(name)
        record = rootless.read_any(name)
        if record is None or record.get("state") != "up":
            raise VirtualClusterError(f"vcluster {name!r} is not up (`workbench vcluster up {name} --nodes N`)")
        vc = cls.__new__(cls)
        vc.plan, vc.keep, vc.record, vc.up_seconds, vc._slurm = Plan.from_dict(record), True, record, None, None
        return vc

    def up(self, timeout: float = 60.0) -> "VirtualCluster":
        """Build the cluster, wait until every node answers (and, with Slurm, every node is idle) and return
        it; nothing is built when it is up already, and what a failed ``up`` built is removed.

        Args:
            timeout: seconds to wait for Slurm's nodes (for the nodes' answers: 10 at most).

        Raises:
            VirtualClusterError: not root, a cluster of this name is up already, a node does not answer, or
                Slurm did not start.
        """
        if self.record is not None:
            return self
        t0 = time.monotonic()
        from . import rootless
        rootless.require_root("up")
        name = self.plan.name
        with registry.locked():
            for stale in registry.stale_names():
                wiring.teardown(stale)
            existing = registry.read_record(name)
            if existing is not None and existing.get("state") == "up":
                raise VirtualClusterError(f"vcluster {name!r} is already up ({existing['nodes']} nodes, "
                                          f"{existing['topology']}): `workbench vcluster down {name}` first")
            wiring.teardown(name)  # what a crashed `up` of this name left
            self.plan.slot = registry.free_slot()
            Path(self.plan.shared).mkdir(parents=True, exist_ok=True, mode=0o755)
            registry.folder(name).mkdir(parents=True, exist_ok=True)
            self.record = {**self.plan.to_dict(), "state": "starting", "created": time.time(),
                           "owner": None if self.keep else _me(), "launcher_address": self.plan.launcher_address}
            registry.write_record(name, self.record)
        try:
            wiring.build(self.plan)
            self._write_scripts()
            problems = wiring.answers(self.plan, timeout=min(timeout, 10))
            if problems:
                raise VirtualClusterError(f"vcluster {name}: {'; '.join(problems)}")
            if self.plan.slurm:
                from .slurm import start_slurm
                self._slurm = start_slurm(self, timeout=timeout)
                self.record["slurm_conf"] = str(self._slurm.conf)
            self.record["state"] = "up"
            registry.write_record(name, self.record)
        except BaseException:
            self.record = None
            with registry.locked():
                wiring.teardown(name)
            raise
        self.up_seconds = time.monotonic() - t0
        return self

    def down(self) -> list[str]:
        """Remove the cluster: every process on its nodes, its Slurm, namespaces, links and folder.
        The shared folder stays (runs and checkpoints live there). Returns what was removed, by name."""
        from . import rootless
        name = self.plan.name
        if rootless.held(name):
            return rootless.down(name)
        if self.plan.slurm:
            from .slurm import stop_slurm
            stop_slurm(self)
        with registry.locked():
            removed = wiring.teardown(name)
        self.record = None
        return removed

    def __enter__(self) -> "VirtualCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        if not self.keep:
            self.down()

    def __repr__(self) -> str:
        p = self.plan
        state = "up" if self.record else "down"
        return (f"<workbench.VirtualCluster {p.name}: {p.nodes} nodes, {p.topology}, "
                f"{format_rate(p.bandwidth)} links ({state})>")

    # -- what it is -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The cluster's name."""
        return self.plan.name

    @property
    def nodes(self) -> int:
        """How many nodes it has."""
        return self.plan.nodes

    @property
    def shared(self) -> Path:
        """The cluster's shared folder: the same path on the head and on every node."""
        return Path(self.plan.shared)

    @property
    def head_address(self) -> str:
        """The head's address on the cluster's bridge: where servers the nodes reach listen."""
        return self.plan.head_address

    @property
    def hostnames(self) -> list[str]:
        """Each node's host name, by node index (``NAME-0``, ...)."""
        return [self.plan.hostname(i) for i in range(self.nodes)]

    @property
    def addresses(self) -> list[str]:
        """Each node's IPv4 address on the cluster's network, by node index."""
        return [self.plan.address(i) for i in range(self.nodes)]

    @property
    def folder(self) -> Path:
        """The cluster's own folder on the head: its record, scripts (``bin/``) and namespaces' files."""
        return registry.folder(self.name)

    @property
    def standin(self) -> Path:
        """The ssh stand-in hydra's launcher runs to start a proxy on a node."""
        return self.folder / "bin" / "standin"

    def visible(self, path: str | os.PathLike) -> bool:
        """Whether the nodes see ``path`` at the same place: anything but ``/tmp`` and ``/dev/shm``,
        except the shared folder and the software mounted there."""
        real = os.path.realpath(path)
        hidden = any(real == top or real.startswith(top + "/") for top in ("/tmp", "/dev/shm"))
        return not hidden or any(real == p or real.startswith(p.rstrip("/") + "/")
                                 for p in wiring.exposed_paths(self.plan))

    def status(self) -> dict:
        """Nodes (hostname, address, processes running) and links (rate, bytes sent so far), as a dict;
        VirtualClusterError for a cluster in a user namespace seen from outside it (use the CLI)."""
        self._not_held("read its status")
        p = self.plan
        return {"name": p.name, "state": (self.record or {}).get("state", "down"), "topology": p.topology,
                "bandwidth": format_rate(p.bandwidth), "latency": p.latency, "queue_bytes": wiring.queue_bytes(p),
                "burst_bytes": wiring.burst_bytes(p.bandwidth), "head_address": p.head_address,
                "bridge": p.bridge, "shared": p.shared, "slurm": p.slurm,
                "nodes": [{"node": i, "hostname": p.hostname(i), "address": p.address(i), "netns": p.netns(i),
                           "processes": len(wiring.processes_on(p, i))} for i in range(p.nodes)],
                "links": self.links()}

    def links(self) -> list[dict]:
        """Every shaped link's counters now: node (``None``: the host end, a switch port), device, rate,
        ``bytes_sent`` and ``drops`` (packets dropped, its queue full); one read of them all."""
        return wiring.link_counters(self.plan)

    def bytes_sent(self) -> int:
        """Bytes every shaped link has sent so far, in all (what crossed the virtual network)."""
        return sum(link["bytes_sent"] for link in self.links())

    def drops(self) -> dict[tuple, int]:
        """Packets each shaped link has dropped so far (its queue full), by ``(node, device)``; links
        that dropped none are left out."""
        return {(link["node"], link["device"]): link["drops"] for link in self.links() if link["drops"]}

    def processes(self, node: int) -> list[int]:
        """Pids of what runs on ``node`` now."""
        return wiring.processes_on(self.plan, node)

    # -- running things on nodes ------------------------------------------------------------
    def enter(self, node: int, cwd: str | os.PathLike | None = None) -> list[str]:
        """The argv prefix that runs a command on ``node`` (in its namespaces, in ``cwd`` when the node
        sees it, else ``/``); PlanError for a bad ``node``, VirtualClusterError outside a rootless cluster's
        user namespace."""
        self.check_node(node)
        self._not_held("enter a node")
        cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
        wd = cwd if self.visible(cwd) else "/"
        return [tools.tool("nsenter"), f"--net={wiring.netns_path(self.plan, node)}",
                f"--uts={wiring.ns_file(self.plan, node, 'uts')}", f"--ipc={wiring.ns_file(self.plan, node, 'ipc')}",
                f"--mount={wiring.ns_file(self.plan, node, 'mnt')}", f"--wd={wd}", "--"]

    def exec(self, node: int, argv: Sequence[str], *, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``node``, wait and return ``subprocess.run``'s ``CompletedProcess`` (output captured
        as text unless ``stdout``/``stderr`` are given; a failing command raises nothing). ``timeout``: seconds
        before it is killed (``subprocess.TimeoutExpired``); ``kwargs``: ``subprocess.run``'s, ``cwd`` as
        :meth:`enter` takes it."""
        kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
        return subprocess.run([*self.enter(node, kwargs.pop("cwd", None)), *argv], text=True, timeout=timeout, **kwargs)

    def _not_held(self, what: str) -> None:
        """A rootless cluster seen from outside its user namespace: its namespaces are not this process's."""
        if os.geteuid() != 0 and (self.record or {}).get("holder"):
            raise VirtualClusterError(f"vcluster {self.name} lives in a user namespace; to {what}, use the CLI, which "
                                      f"runs inside it: workbench vcluster exec|mpiexec|status {self.name} ...")

    def check_node(self, node) -> None:
        """A one-line PlanError unless ``node`` is one of this cluster's node indices (an int, 0..nodes-1)."""
        if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node < self.nodes:
            raise PlanError(f"node: must be 0..{self.nodes - 1} on vcluster {self.name}; got {node!r}")

    def mpiexec_args(self, nranks: int, ppn: int = 1, wdir: str | os.PathLike | None = None,
                     flavour: MPIFlavour | None = None, nodes: Sequence[int] | None = None) -> list[str]:
        """mpiexec arguments that place ``nranks`` ranks on the nodes (``nodes``: those of them, in order;
        default all), ``ppn`` per node in block order (ranks 0..ppn-1 on the first, ...), started through
        :attr:`standin`, in ``wdir`` (default: this directory if the nodes see it, else the shared folder),
        in the words of the MPI library ``flavour`` (default the one the launchers run:
        :func:`workbench.mpilib.flavour`). A PlanError when ``nranks`` or ``ppn`` is not an integer >= 1, a node
        is not one of the cluster's, or the nodes cannot hold ``nranks`` at ``ppn`` per node."""
        from ..checks import integer
        integer("ranks", nranks, error=PlanError)
        integer("ppn", ppn, error=PlanError)
        nodes = list(range(self.nodes)) if nodes is None else list(nodes)
        for node in nodes:
            self.check_node(node)
        needed = -(-nranks // ppn)
        if needed > len(nodes):
            raise PlanError(f"ppn: {nranks} ranks at {ppn} per node need {needed} nodes; vcluster {self.name} has "
                            f"{len(nodes)}" + (f" to use ({len(nodes)} of {self.nodes})" if len(nodes) < self.nodes
                                               else "") + f" (raise --ppn to at least {-(-nranks // len(nodes))})")
        mpi = flavour or mpilib.flavour()
        wdir = os.fspath(wdir) if wdir is not None else os.getcwd()
        iface = "eth0" if self.launcher_network() else self.plan.bridge  # the launcher network's one cable
        return [*mpi.remote_args(str(self.standin), iface, str(self.plan.subnet)),
                *mpi.hosts_args([self.plan.address(i) for i in nodes[:needed]], ppn),
                *mpi.wdir_args(wdir if self.visible(wdir) else str(self.shared))]

    def launcher_network(self) -> list[str]:
        """What starts a launcher (the head's mpiexec) in the cluster's launcher network: a namespace whose one
        cable goes to the cluster's bridge (:attr:`~.plan.Plan.launcher_address`), so that what the launcher
        listens on (hydra's unauthenticated control port, on every address it has) is reached from the nodes
        and from no other user of the host. ``[]`` for a cluster made before it had one (it then runs on the
        head's network, as it did)."""
        if not (self.record or {}).get("launcher_address"):
            return []
        return [tools.tool("nsenter"), f"--net={wiring.netns_path(self.plan, None)}"]

    def mpi_env(self, flavour: MPIFlavour | None = None) -> dict[str, str]:
        """Environment of the ranks: the MPI library's messages over TCP on the nodes' ``eth0``
        (:meth:`~workbench.mpilib.MPIFlavour.transport_env`; MPICH's is :data:`MPI_ENV`), and the cluster's
        name (``WORKBENCH_VCLUSTER``)."""
        return {**(flavour or mpilib.flavour()).transport_env("eth0"), "GLOO_SOCKET_IFNAME": "eth0",
                "WORKBENCH_VCLUSTER": self.name}

    def run_options(self, nranks: int, ppn: int = 1, job_dir: str | os.PathLike | None = None,
                    cwd: str | os.PathLike | None = None, nodes: Sequence[int] | None = None) -> dict:
        """Keyword arguments of :func:`~workbench.runtime.launch.launcher.run_mpi` that run its ranks on
        the nodes (``nodes``: those of them; default all): hosts and launcher, transport, the job's folder
        (``job_dir``, default the shared folder's ``jobs/``: the nodes write there), the head address for
        the ranks' heartbeats and the network mpiexec starts in (:meth:`launcher_network`). ``nranks``, ``ppn``,
        ``cwd`` (the ranks' working directory) and ``nodes``: as :meth:`mpiexec_args` takes them; PlanError as it
        raises, or when the nodes do not see ``job_dir``."""
        job_dir = Path(job_dir) if job_dir is not None else self.shared / "jobs"
        if not self.visible(job_dir):
            raise PlanError(f"job_dir: {job_dir} is not seen by the nodes of vcluster {self.name} (they have "
                            f"their own /tmp and /dev/shm); use a folder under {self.shared} or outside /tmp")
        return {"mpi_args": self.mpiexec_args(nranks, ppn, cwd, nodes=nodes), "env": self.mpi_env(), "job_dir": job_dir,
                "heartbeat": self.head_address, "network": self.launcher_network()}

    def slurm_env(self) -> dict[str, str]:
        """``SLURM_CONF`` of the cluster's Slurm and ``PATH`` with its commands first (they run as the
        head, whose name resolves to its bridge address, so srun's own ports are reachable from the nodes);
        PlanError for a cluster without Slurm."""
        if not self.plan.slurm:
            raise PlanError(f"slurm: vcluster {self.name} has no Slurm (`workbench vcluster up {self.name} --slurm`)")
        from .slurm import root_of
        conf = (self.record or {}).get("slurm_conf") or str(root_of(self) / "slurm.conf")
        return {"SLURM_CONF": conf, "PATH": f"{self.folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}

    def env_lines(self) -> str:
        """``export`` lines for a shell on the head: the Slurm of the cluster (``SLURM_CONF``, and
        ``PATH`` with Slurm's commands run as the head, whose name resolves to its bridge address)."""
        lines = [f"export WORKBENCH_VCLUSTER={self.name}"]
        if self.plan.slurm:
            lines += [f"export SLURM_CONF={self.slurm_env()['SLURM_CONF']}", f"export PATH={self.folder / 'bin'}:$PATH"]
        return "\n".join(lines)

    def _write_scripts(self) -> None:
        """The stand-in for ssh (hydra's launcher) and, with Slurm, the head's Slurm commands."""
        p, nsenter = self.plan, tools.tool("nsenter")
        cases = "\n".join(f"  {p.address(i)}|{p.hostname(i)}) n={i};;" for i in range(p.nodes))
        ns = registry.folder(p.name) / "ns"
        script = f"""#!/bin/sh
# vcluster {p.name}: hydra's ssh launcher runs `standin [-x] HOST COMMAND`: COMMAND runs on node HOST
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
case "$host" in
{cases}
  *) echo "vcluster {p.name}: no node called $host" >&2; exit 255;;
esac
exec {nsenter} --net=/var/run/netns/{PREFIX}-{p.name}-$n --uts={ns}/$n.uts --ipc={ns}/$n.ipc --mount={ns}/$n.mnt --wd=/ -- sh -c "$*"
"""
        self.standin.write_text(script)
        self.standin.chmod(0o755)
        if p.slurm:
            for command in ("srun", "sbatch", "salloc", "squeue", "scancel", "sinfo", "scontrol"):
                real = shutil.which(command, path="/usr/bin:/usr/sbin:/bin") or f"/usr/bin/{command}"
                wrapper = self.folder / "bin" / command
                wrapper.write_text(f"""#!/bin/sh
# {command} as the head of vcluster {p.name} (whose name resolves to {p.head_address}); on a node (a job's
# PATH carries this folder there too) the command itself
case "$(hostname)" in {p.name}-[0-9]*) exec {real} "$@";; esac
exec {nsenter} --uts={ns}/head.uts --mount={ns}/head.mnt --wd="$PWD" -- {real} "$@"
""")
                wrapper.chmod(0o755)


def _me() -> dict:
    import psutil
    me = psutil.Process()
    return {"pid": me.pid, "started": me.create_time()}

