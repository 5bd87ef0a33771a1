"""How a :class:`~workbench.runtime.client.cluster.Cluster` asks ipyparallel for its controller and
engines: the launcher, the engines' command (each under the rank guard) and environment, where
the controller listens, and where the cluster's files go.

Where the engines run decides the rest: on this host (``engines="mpi"``), as a batch job
(``engines="slurm"`` and the other batch systems: the controller listens on all interfaces with
``reachable=True``), or on the nodes of a virtual cluster (``vcluster=``): then the controller,
the live stream and the heartbeat listener listen on the head's address on the cluster's bridge,
the engines start through the cluster's launcher with its transport, and the cluster's files (the
controller's connection files, the guards' records, batch scripts) go to a folder the nodes see.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
from collections import deque
from pathlib import Path

from ...checks import integer
from ...config import ConfigError
from ..launch.engines import LAUNCHERS, SRUN_DEFAULTS, slurm_launcher
from ...mpilib import find_mpiexec, flavour_of
from ...paths import private_file
from ..launch.mpiexec import GUARD, RANK_ENV
from .records import CLUSTER_ID_ENV, batch_dir, guard_dir


def ipp_cluster(cluster, cluster_id: str):
    """The ``ipyparallel.Cluster`` of ``cluster`` (a workbench Cluster) under ``cluster_id``."""
    import ipyparallel as ipp
    from traitlets.config import Config

    s, prefix, vc, files = cluster._settings, LAUNCHERS[cluster.engines], cluster.vcluster, cluster.files
    config = Config()
    engine_launcher = f"{prefix}EngineSetLauncher"
    bin_dir = str(Path(sys.executable).parent)
    environment = {**RANK_ENV, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), CLUSTER_ID_ENV: cluster_id,
                   **(vc.mpi_env() if vc is not None else {}), **cluster.heartbeat_env}
    config[engine_launcher].environment = environment
    # the controller runs here whatever starts the engines (ipp.Cluster(engines=...) sets only
    # the engine launcher): marked, so a dead kernel's controller is found and stopped
    config.LocalControllerLauncher.environment = {CLUSTER_ID_ENV: cluster_id}
    guarded = [sys.executable, "-I", str(GUARD), str(guard_dir(cluster_id, files)), sys.executable, "-m",
               "ipyparallel.engine"]
    if cluster.engines == "mpi":
        _mpiexec_engines(config, cluster, guarded)
    else:
        config[engine_launcher].engine_args = ["--mpi"]  # engine id order = MPI rank order
        if cluster.engines == "slurm":
            config[engine_launcher].srun_args = SRUN_DEFAULTS + s["srun_args"]
            config[engine_launcher].state_folder = str(batch_dir(cluster_id, files))
            config[engine_launcher].engine_cmd = guarded
            if vc is not None:  # the cluster's own Slurm, its commands run as its head
                config[engine_launcher].submit_command = [str(vc.folder / "bin" / "sbatch")]
                config[engine_launcher].delete_command = [str(vc.folder / "bin" / "scancel")]
        for trait in ("account", "queue", "timelimit"):
            if s[trait]:
                config[engine_launcher][trait] = s[trait]
        spread = [f"#SBATCH --nodes={-(-cluster.n // cluster.ppn)}", f"#SBATCH --ntasks-per-node={cluster.ppn}"] \
            if vc is not None else []
        options = "\n".join(filter(None, [*spread, s["options"]]))
        if options:
            config[engine_launcher].options = options
    for cls, traits in s["ipp_config"].items():
        for trait, value in traits.items():
            config[cls][trait] = value
    location = {"controller_ip": cluster.listen_ip, "controller_location": cluster.advertised_ip}
    controller = []
    if cluster.sockets is not None:  # engines in a network of their own: Unix sockets in a 0700 folder
        location["controller_ip"] = str(Path(cluster.sockets) / "c")
        controller.append("--IPController.transport=ipc")
    profile_dir = files / "ipython"
    profile_dir.mkdir(parents=True, exist_ok=True)
    controller.append(f"--config={_controller_config(profile_dir, cluster_id, s['curve'])}")
    engines = slurm_launcher() if cluster.engines == "slurm" else cluster.engines
    # ipyparallel logs to the notebook's output in a kernel (the engines' whole log when they
    # are stopped): keep it here instead, shown only when something failed (log_tail())
    log = logging.getLogger(f"workbench.cluster.{cluster_id}")
    log.handlers, log.propagate = [cluster._log], False
    log.setLevel(logging.INFO)
    # on a virtual cluster the engines' own heartbeats (10 s) tell a node that stopped answering, by name:
    # the hub's (500 ms x 10 misses) would drop its engines first, as if they had died
    beats = ["--HeartMonitor.period=500"] + (["--HeartMonitor.max_heartmonitor_misses=60"] if vc is not None else [])
    return ipp.Cluster(engines=engines, n=cluster.n, config=config, log_level=logging.INFO, log=log,
                       controller_args=beats + controller, profile_dir=str(profile_dir),
                       shutdown_atexit=True, cluster_id=cluster_id, **location)


def _mpiexec_engines(config, cluster, guarded: list[str]) -> None:
    """``mpiexec -n N`` engines in the words of its MPI library (:mod:`workbench.mpilib`: what it needs to
    start them here, their placement on a virtual cluster's nodes), each under the rank guard, which
    records how it ended (see runtime.rankguard)."""
    mpiexec, vc = find_mpiexec(), cluster.vcluster
    # engines here in a network of their own; on a virtual cluster's nodes, mpiexec in its launcher network
    network = vc.launcher_network() if vc is not None else cluster.private_prefix or []
    config.MPIEngineSetLauncher.mpi_cmd = [*network, mpiexec]
    config.MPIEngineSetLauncher.mpi_args = engine_mpi_args(cluster, cluster.n)
    config.MPIEngineSetLauncher.engine_cmd = guarded


def engine_mpi_args(cluster, n: int, nodes=None) -> list[str]:
    """The engines' mpiexec arguments for ``n`` engines: on a virtual cluster placed ``ppn`` a node on
    ``nodes`` (its node indices; default all), then the user's ``mpi_args``."""
    mpi, vc = flavour_of(find_mpiexec()), cluster.vcluster
    placement = vc.mpiexec_args(n, cluster.ppn, wdir=vc.shared, flavour=mpi, nodes=nodes) if vc is not None else []
    args = placement + cluster._settings["mpi_args"]
    return mpi.start_args(n, placed=mpi.placed(args)) + args


def engine_room(cluster) -> tuple[int, list[int] | None, list[str]]:
    """Where a restart of ``cluster``'s engines goes: ``(n, nodes, lost)``. On a virtual cluster with mpiexec
    engines, the nodes that answer the head now, as many as the ``n`` it was made with need (fewer engines
    when nodes are lost; a node that is back is used again) and the hostnames of those that do not answer;
    elsewhere ``(planned n, None, [])``: the engines start where they ran."""
    vc, planned = cluster.vcluster, cluster.planned_n
    if vc is None or cluster.engines != "mpi":
        return planned, None, []
    up = vc.answering()
    nodes = up[:-(-planned // cluster.ppn)]
    return min(planned, len(nodes) * cluster.ppn), nodes, [vc.hostnames[i] for i in range(vc.nodes) if i not in up]


def _controller_config(profile_dir: Path, cluster_id: str, curve: bool) -> Path:
    """The controller's config file in its profile (0600 in the 0700 state folder; never a command line):
    CurveZMQ when ``curve``, and its HMAC key. ipyparallel 9 drops the signatures with CurveZMQ on unless
    ``Session.key`` is configured with it, and every engine then warns "Message signing is disabled"."""
    import secrets
    from ...files import atomic_write
    path = profile_dir / "security" / f"ipcontroller-{cluster_id}-config.py"  # removed with the cluster's keys
    path.parent.mkdir(mode=0o700, exist_ok=True)
    atomic_write(path, f"c.Session.key = {secrets.token_hex(16).encode()!r}\n"
                       f"c.IPController.enable_curve = {curve!r}\n")
    path.chmod(0o600)
    return path


def check_keys(files: Path) -> None:
    """The connection files already in ``files`` (other clusters' keys) are readable by this user alone
    (:func:`~workbench.paths.private_file`): one line naming a file that is not, before anything starts."""
    for path in (files / "ipython" / "security").glob("ipcontroller-*.json"):  # cluster-*.json hold no key
        private_file(path)


def private_network(cluster) -> list[str]:
    """What starts the engines' mpiexec in a network of its own (:mod:`..launch.private_net`): engines
    on this host (not on a virtual cluster's nodes or hosts that ``mpi_args`` name, nor ``reachable``
    for a batch system); [] for the host's network."""
    if cluster.engines != "mpi" or cluster.vcluster is not None or cluster._settings["reachable"]:
        return []
    if flavour_of(find_mpiexec()).on_hosts(cluster._settings["mpi_args"]):  # the user's own hosts
        return []
    from ..launch import private_net
    return private_net.prefix()


def link_ipc_sockets(folder: str, security: Path, cluster_id: str, timeout: float = 30.0) -> None:
    """ipyparallel's controller binds ``ipc://PATH-PORT`` while its engines and client connect to
    ``ipc://PATH:PORT`` (ipyparallel 9: ``controller/app.py`` joins with ``-``, ``engine/app.py`` and
    ``client/client.py`` with ``:``): each socket that the controller's connection files (in
    ``security``, written after it started) name gets a link under the name they look for, once bound."""
    import json
    import time
    deadline = time.monotonic() + timeout
    ports: set[int] = set()
    for kind in ("engine", "client"):
        path = security / f"ipcontroller-{cluster_id}-{kind}.json"
        while True:
            try:
                info = json.loads(path.read_text())
                break
            except (OSError, ValueError):  # not written yet, or half
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the controller wrote no {path} in {timeout:g} s") from None
                time.sleep(0.02)
        for value in info.values():
            ports.update(v for v in (value if isinstance(value, list) else [value])
                         if isinstance(v, int) and not isinstance(v, bool))
    while ports:
        for port in sorted(ports):
            if (Path(folder) / f"c-{port}").is_socket():
                (Path(folder) / f"c:{port}").symlink_to(f"c-{port}")
                ports.discard(port)
        if ports and time.monotonic() > deadline:
            raise TimeoutError(f"the controller bound no socket for ports {sorted(ports)} in {timeout:g} s")
        time.sleep(0.02)


def reachable_addresses(reachable) -> tuple[str, str] | None:
    """Where a controller that compute nodes reach listens and what the engines are told, for
    ``reachable``: an interface of this host (``"ib0"``) or one of its IPv4 addresses, both then that
    address alone; True: the address this host's name resolves to, or, where that is a loopback (a
    Debian ``/etc/hosts``), every interface, with a warning naming the fix; False: None. A one-line
    ConfigError for anything else, before anything starts."""
    if reachable is False:
        return None
    import psutil
    own = {name: [a.address for a in addrs if a.family == socket.AF_INET]
           for name, addrs in psutil.net_if_addrs().items()}
    if reachable is True:
        try:
            address = socket.gethostbyname(socket.gethostname())
        except OSError:
            address = "127.0.0.1"
        if not address.startswith("127."):
            return address, address
        import warnings
        warnings.warn(f"reachable=True: this host's name resolves to {address} here, so the controller listens on "
                      "every interface; name the one the compute nodes reach: reachable="
                      f"{next((n for n in own if n != 'lo' and own[n]), 'ib0')!r} (or its address)", stacklevel=3)
        return "*", socket.gethostname()
    if isinstance(reachable, str) and own.get(reachable):
        return own[reachable][0], own[reachable][0]
    if isinstance(reachable, str) and any(reachable in addresses for addresses in own.values()):
        return reachable, reachable
    raise ConfigError(f"reachable: True, False, or an interface or IPv4 address of this host the compute nodes reach "
                      f"({', '.join(f'{n} {a[0]}' for n, a in sorted(own.items()) if a)}); got {reachable!r}")


def listen_ip(cluster) -> str:
    """Where the controller and the live stream listen: the virtual cluster's head address, the address
    (or, failing one, every interface) that ``reachable`` names (:func:`reachable_addresses`), or 127.0.0.1."""
    if cluster.vcluster is not None:
        return cluster.vcluster.head_address
    reachable = cluster._settings["reachable_at"]
    return reachable[0] if reachable else "127.0.0.1"


def advertised_ip(cluster) -> str:
    """The address the engines are told to connect to."""
    if cluster.vcluster is not None:
        return cluster.vcluster.head_address
    reachable = cluster._settings["reachable_at"]
    return reachable[1] if reachable else "127.0.0.1"


class KeptLog(logging.Handler):
    """Keeps the last log records of a cluster's ipyparallel objects instead of printing them."""

    def __init__(self, limit: int = 2000) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        self._records: deque[str] = deque(maxlen=limit)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._records.extend(self.format(record).splitlines())
        except Exception:  # noqa: BLE001 - logging must never break a stop
            pass

    @property
    def lines(self) -> list[str]:
        return list(self._records)


def virtual_cluster(vcluster, engines: str, n: int, ppn: int, reachable: bool):
    """``vcluster`` as a VirtualCluster that can hold ``n`` engines ``ppn`` per node (None: none),
    else a one-line ConfigError."""
    integer("ppn: engines per node", ppn, error=ConfigError)
    if vcluster is None:
        if ppn != 1:
            raise ConfigError("ppn: engines per node of a virtual cluster; give vcluster= too")
        return None
    from ..launch.heartbeat import timeout_seconds
    timeout_seconds()  # the nodes' heartbeats: a bad $WORKBENCH_HEARTBEAT_TIMEOUT is one line, now
    from ...vcluster import PlanError, VirtualCluster, VirtualClusterError
    try:
        vc = VirtualCluster.attach(vcluster) if isinstance(vcluster, str) else vcluster
        if not isinstance(vc, VirtualCluster):
            raise ConfigError(f"vcluster: expected a workbench.VirtualCluster or the name of one, got {vcluster!r}")
        vc.mpiexec_args(n, ppn)  # enough nodes
    except (PlanError, VirtualClusterError) as exc:
        raise ConfigError(f"vcluster: {exc}") from None
    if engines not in ("mpi", "slurm"):
        raise ConfigError(f"engines: on a virtual cluster, 'mpi' (mpiexec across its nodes) or 'slurm' (its Slurm); "
                          f"got {engines!r}")
    if engines == "slurm" and not vc.plan.slurm:
        raise ConfigError(f"engines: vcluster {vc.name} has no Slurm (`workbench vcluster up {vc.name} --slurm`); "
                          "use engines='mpi'")
    if reachable:
        raise ConfigError("reachable: on a virtual cluster everything listens on its head address; leave it out")
    if vc.record is None:
        raise ConfigError(f"vcluster: {vc.name} is not up (vc.up(), or `with VirtualCluster(...) as vc:`)")
    return vc


def use_slurm_of(cluster, vcluster) -> None:
    """Point this process's Slurm commands (``SLURM_CONF``, ``PATH``) at a virtual cluster's Slurm
    while the engines run there (None: put back what was before)."""
    keys = ("SLURM_CONF", "PATH")
    if vcluster is not None and cluster._slurm_env_before is None:
        cluster._slurm_env_before = {k: os.environ.get(k) for k in keys}
        os.environ.update(vcluster.slurm_env())
    elif vcluster is None and cluster._slurm_env_before is not None:
        for k, v in cluster._slurm_env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        cluster._slurm_env_before = None
