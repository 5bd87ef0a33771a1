"""``wb.Cluster``: ipyparallel engines that are MPI ranks, started from a notebook in one call.

    with wb.Cluster(n=4) as cluster:          # mpiexec -n 4 python -m ipyparallel.engine --mpi
        run = cluster.train(cfg)              # returns at once; see workbench.runtime.client.run.Run
        result = run.wait()

Why the settings below (what start and stop take: benchmarks/README.md, "Start, stop, dashboard overhead"):
- ``HeartMonitor.period=500`` ms: with ipyparallel's default (3 s) a start on a small machine
  spends most of its time waiting for heartbeats; 500 ms shortens that wait.
- Engines are stopped with ``stop_engines`` + ``stop_controller``, not ``stop_cluster``, which
  is several times slower: it waits politely for each process.
- ``mpiexec`` is found beside this Python (the venv's, from the ``mpich`` wheel) or on PATH, and
  the engines' PATH gets this Python's ``bin``: a kernel whose PATH lacks the venv still works.
- Every cluster started here is recorded (owner pid and start time, ipyparallel's cluster file)
  under ``$WORKBENCH_STATE_DIR/clusters`` (default ``~/.cache/workbench/clusters``). A kernel that
  dies leaves its controller, mpiexec and engines running; the next ``Cluster()`` finds those
  records, stops what they name, kills stray engines and removes what killed MPI jobs of this user
  left (``/dev/shm`` segments).

Batch systems: ``engines="slurm"`` (or ``pbs``, ``sge``, ``lsf``) starts the engines as one batch
job (``srun ... ipyparallel.engine --mpi``) with ``account``, ``queue`` (partition), ``timelimit``
and extra ``options``; ``controller_ip="*"`` with ``controller_location=<this host>`` makes the
controller reachable from compute nodes (``reachable=True``). :meth:`Cluster.batch_script` shows
the script without submitting it.

Slurm (tested against a running Slurm 22.05, ``tests/test_slurm.py``): ``srun_args`` go to the
engines' ``srun`` (``["--mpi=pmi2"]``), after ``--kill-on-bad-exit=1`` (a job that lost an engine is
ended, as mpiexec ends it); each engine runs under the rank guard like local engines. The batch
script and Slurm's output are in ``$WORKBENCH_STATE_DIR/batch/<cluster id>/``, never the working
directory. While the engines come up the job is watched: a job that ends first is an error with its
Slurm output, one still pending at ``start_timeout`` is cancelled and named with Slurm's reason. The
job id is in the cluster's record, so the next ``Cluster()`` after a kernel died cancels the job.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ...checks import integer
from ...config import ConfigError, RunConfig
from ..launch.blame import describe_end, rank_records
from ..launch import slurm
from ..launch.engines import LAUNCHERS, SlurmCommandError
from ..launch.leftovers import remove_leftovers
from ..processes import alive
from .ipp_setup import (KeptLog, check_keys, link_ipc_sockets, private_network, reachable_addresses, use_slurm_of,
                        virtual_cluster)
from .records import (cleanup_stale_clusters, cmdline, guard_dir, kill, processes_of, record_path,  # noqa: F401 - cleanup_stale_clusters re-exported
                      remove_files_of, write_record)
from ...paths import state_dir

#: seconds between two looks at a Slurm engine job's state while the engines come up
SLURM_POLL_SECONDS = 0.5


def _string_list(name: str, value, example: str) -> list[str]:
    """``value`` as a list of strings (None: empty), else a one-line ConfigError."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name}: expected a list of strings like {example}, got {value!r}")
    return list(value)

class Cluster:
    """ipyparallel engines that are MPI ranks (local ``mpiexec`` by default).

    Args:
        n: number of engines = MPI ranks (>= 1).
        engines: ``"mpi"`` (mpiexec on this machine) or a batch system: ``"slurm"``, ``"pbs"``,
            ``"sge"``, ``"lsf"``.
        reachable: where engines on compute nodes connect (batch systems): an interface of this host
            (``"ib0"``) or one of its addresses, or True (the address this host's name resolves to; where
            that is a loopback, every interface, with a warning). Otherwise everything listens on
            127.0.0.1. CurveZMQ and the HMAC key guard the controller either way.
        account: the batch system's account (``#SBATCH --account`` for Slurm; the same meaning for
            PBS/SGE/LSF); empty: the site's default.
        queue: the queue (``--partition`` for Slurm); empty: the default.
        timelimit: the job's time limit in the batch system's format (``--time`` for Slurm,
            ``"HH:MM:SS"``); empty: the default.
        options: extra directive lines for the engines' batch script, e.g.
            ``"#SBATCH --gres=gpu:4\\n#SBATCH --constraint=a100"``.
        mpi_args: extra ``mpiexec`` arguments (``engines="mpi"``).
        srun_args: extra arguments of the engines' ``srun`` (``engines="slurm"``), e.g.
            ``["--mpi=pmi2"]`` where the site's ``MpiDefault`` gives ranks no PMI.
        start_timeout: seconds to wait for all engines to register (a Slurm job still pending
            then is cancelled).
        ipp_config: extra ipyparallel configuration, ``{"Class": {"trait": value}}``.
        vcluster (VirtualCluster | str | None): a :class:`~workbench.vcluster.cluster.VirtualCluster`
            (or the name of one that is up):
            the engines run on its nodes (``engines="mpi"``: mpiexec across them; ``"slurm"``: a
            job of the cluster's own Slurm), ``ppn`` per node; the controller, the live stream and
            the engines' heartbeats listen on its head address; runs must write where its nodes see.
        ppn: engines per node on ``vcluster`` (block placement, default 1).
        curve: CurveZMQ between the controller, the engines and this client (encrypted and keyed:
            the server key goes in the 0600 connection files); ``False`` for ipyparallel's HMAC
            signatures alone. Engines on this host run in a network of their own where the kernel
            allows it (``$WORKBENCH_NETWORK``, docs/security.md).

    Raises:
        ConfigError: at construction, before anything starts, with one line naming the argument: ``n`` or
            ``ppn`` not an integer >= 1, an unknown ``engines``, ``mpi_args`` or ``srun_args`` not a list of
            strings or given to the other launcher, ``options`` for another batch system than Slurm,
            ``start_timeout`` not a finite number > 0, ``curve`` not a bool, a ``reachable`` that names no
            interface or address of this host; ``ppn`` without ``vcluster``, or a ``vcluster`` that is not up,
            has too few nodes for ``n`` engines at ``ppn`` per node, has no Slurm for ``engines="slurm"``
            or is given with ``reachable``.

    Attributes:
        n (int): the engines there are now (fewer than ``planned_n`` after a restart on a virtual cluster that lost
            a node).
        planned_n (int): the engines asked for; a restart uses a node that is back again, up to these.
        engines (str): the launcher, as given.
        start_timeout (float): seconds to wait for the engines to register.
        client (ipyparallel.Client | None): the ipyparallel ``Client`` (None until :meth:`start`).
        ranks (dict[int, int]): engine id -> MPI rank.
        engine_ids (list[int]): the current engines' ids.
        pids (dict[int, int]): MPI rank -> engine process id.
        hosts (dict[int, str]): MPI rank -> the engine's host name.
        active_run (Run | None): the last :class:`~workbench.runtime.client.run.Run` started (None before the first).
        engines_need_restart (bool): the engines were killed or failed; the next :meth:`train` replaces them.
        slurm_job (str | None): the engines' current Slurm job id (``engines="slurm"``), else None.
        private_prefix (list[str] | None): what starts mpiexec in a network of its own (None or ``[]``: the
            host's network).
        sockets (str | None): the 0700 folder of the controller's and live streams' Unix sockets (a network of its own),
            else None.
    """

    def __init__(self, n: int = 4, engines: str = "mpi", *, reachable: bool | str = False,
                 account: str = "", queue: str = "", timelimit: str = "", options: str = "",
                 mpi_args: list[str] | None = None, srun_args: list[str] | None = None,
                 start_timeout: float = 60.0, ipp_config: dict[str, dict[str, Any]] | None = None,
                 vcluster=None, ppn: int = 1, curve: bool = True) -> None:
        integer("n: number of engines", n, error=ConfigError)
        self.vcluster, self.ppn = virtual_cluster(vcluster, engines, n, ppn, reachable), ppn
        if engines not in LAUNCHERS:
            raise ConfigError(f"engines: unknown launcher {engines!r}; allowed: {', '.join(LAUNCHERS)}")
        mpi_args = _string_list("mpi_args", mpi_args, "['-bind-to', 'core']")
        srun_args = _string_list("srun_args", srun_args, "['--mpi=pmi2']")
        if srun_args and engines != "slurm":
            raise ConfigError(f"srun_args: arguments of the engines' srun, for engines='slurm' only; "
                              f"engines={engines!r}" + (" takes mpi_args (mpiexec's)" if engines == "mpi" else ""))
        if mpi_args and engines != "mpi":
            raise ConfigError(f"mpi_args: arguments of mpiexec, for engines='mpi' only"
                              + ("; engines='slurm' takes srun_args" if engines == "slurm" else ""))
        if not (isinstance(start_timeout, (int, float)) and not isinstance(start_timeout, bool)
                and 0 < start_timeout < float("inf")):
            raise ConfigError(f"start_timeout: must be a finite number of seconds > 0, got {start_timeout!r}")
        if options and engines != "slurm":
            raise ConfigError(f"options: extra batch directives are supported for engines='slurm' only; "
                              f"for {engines!r} pass ipp_config={{'{LAUNCHERS[engines]}EngineSetLauncher': "
                              "{'batch_template': ...}}")
        self.n, self.engines = n, engines
        self.planned_n = n  # the engines asked for: a restart uses again a node that is back, up to these
        self.start_timeout = start_timeout
        if not isinstance(curve, bool):
            raise ConfigError(f"curve: True (CurveZMQ, the default) or False, got {curve!r}")
        self._settings = dict(curve=curve, reachable=reachable, reachable_at=reachable_addresses(reachable), account=account, queue=queue, timelimit=timelimit,
                              options=options, mpi_args=mpi_args, srun_args=srun_args, ipp_config=ipp_config or {})
        self._ipp = None
        self.client = None
        self.ranks: dict[int, int] = {}  # engine id -> MPI rank
        self.engine_ids: list[int] = []
        self.pids: dict[int, int] = {}
        self.hosts: dict[int, str] = {}
        self.active_run = None
        self.engines_need_restart = False
        self.slurm_job: str | None = None  # the engines' current Slurm job (engines="slurm")
        self._slurm_jobs: list[str] = []  # every engine job this cluster submitted
        self._log = KeptLog()
        self._heartbeats = None  # engines on a virtual cluster beat here (runtime.launch.heartbeat)
        self.private_prefix: list[str] | None = None  # what starts mpiexec in a network of its own
        self.sockets: str | None = None  # then: the 0700 folder of the controller's and live streams' sockets
        self._slurm_env_before: dict | None = None

    # -- configuration ---------------------------------------------------------------------
    def _ipp_cluster(self):
        from .ipp_setup import ipp_cluster
        return ipp_cluster(self, f"wb-{os.getpid()}-{secrets.token_hex(3)}")

    def _private_network(self) -> None:
        """Engines on this host start in a network of their own (no port of theirs reachable by another
        user): the controller and the live streams then listen on Unix sockets in a new 0700 folder."""
        self.private_prefix = private_network(self)
        if self.private_prefix:
            import tempfile
            self.sockets = tempfile.mkdtemp(prefix="wb-")  # short: a socket's path has at most 107 bytes

    def batch_script(self, workdir: str | os.PathLike | None = None) -> str:
        """The engines' batch script as it would be submitted (batch systems only); nothing is submitted.

        Args:
            workdir: the folder the script names as the job's working directory (default: a temporary one).

        Returns:
            The script's text.

        Raises:
            ConfigError: ``engines="mpi"``, which submits no batch job.
        """
        if self.engines == "mpi":
            raise ConfigError("batch_script: engines='mpi' submits no batch job; "
                              f"use one of {', '.join(k for k in LAUNCHERS if k != 'mpi')}")
        import tempfile
        cluster = self._ipp_cluster()
        with tempfile.TemporaryDirectory() as tmp:
            launcher = cluster.engine_launcher_class(
                work_dir=str(workdir or tmp), parent=cluster, log=cluster.log, profile_dir=cluster.profile_dir,
                cluster_id=cluster.cluster_id, engine_set_id="preview")
            launcher.batch_file = str(Path(workdir or tmp) / "engines-preview.sbatch")
            try:
                launcher.write_batch_script(self.n)
                return Path(launcher.batch_file).read_text()
            finally:
                remove_files_of(cluster.cluster_id, None)  # the folder the launcher made for a real job

    # -- start and stop --------------------------------------------------------------------
    def start(self) -> "Cluster":
        """Start the controller and ``n`` engines and connect (stale clusters are stopped first); nothing
        when already started. Waits up to ``start_timeout`` seconds for the engines to register. What
        started is stopped again when this raises.

        Returns:
            (Cluster): This cluster (``with Cluster(...) as cluster`` calls it).

        Raises:
            UnsafeFolder: a connection file of another cluster is readable by other users.
            TimeoutError: fewer than ``n`` engines registered, or answered, within ``start_timeout`` seconds
                (the message holds the engines' log or the Slurm job's output).
            RuntimeError: Slurm refused the engines' job, or the job ended, or was still pending at
                ``start_timeout`` (then cancelled; the message gives Slurm's reason).
            ConfigError: the engines are not one MPI job (mpi4py uses another MPI library than the launcher's).
        """
        if self._ipp is not None:
            return self
        cleanup_stale_clusters()
        check_keys(self.files)
        if self.vcluster is not None:
            from ..launch.heartbeat import Listener
            self._heartbeats = Listener(self.vcluster.head_address, self.n)
            if self.engines == "slurm":
                use_slurm_of(self, self.vcluster)
        self._private_network()
        self._ipp = self._ipp_cluster()
        guard_dir(self._ipp.cluster_id, self.files).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._ipp.start_controller_sync()
        self._record()
        try:
            if self.sockets is not None:
                link_ipc_sockets(self.sockets, Path(self._ipp.profile_dir) / "security", self._ipp.cluster_id)
            self._start_engines()
        except BaseException:
            self.stop()
            raise
        return self

    def _engine_keys(self) -> set[tuple[int, str]]:
        """(id, uuid) of every registered engine: a new engine may get an old one's id (Slurm
        engines ask for their MPI rank as id), never its uuid."""
        return {(e, self.client._engines.get(e)) for e in self.client.ids}

    def _start_engines(self, exclude: frozenset[tuple[int, str]] = frozenset()) -> None:
        """Start an engine set and wait until ``n`` new engines (not in ``exclude``, from
        :meth:`_engine_keys`) registered.

        Polls ``client.ids`` every 10 ms: ``wait_for_engines`` sleeps in long intervals and
        would add up to a second to every start.
        """
        deadline = time.monotonic() + self.start_timeout
        try:
            engine_set = self._ipp.start_engines_sync()
        except SlurmCommandError as exc:  # sbatch refused the job: nothing was queued
            raise RuntimeError(f"Slurm refused the engines' job ({self.n} tasks): {exc}") from None
        if self.engines == "slurm":
            launcher = self._ipp.engines[engine_set]
            self.slurm_job, self._slurm_output = launcher.job_id, launcher.output_file
            self._slurm_jobs.append(self.slurm_job)
            self._record()  # the job id, for the cleanup after a kernel that dies
        if self.client is None:
            self.client = self._ipp.connect_client_sync()
        next_look = 0.0
        while True:
            new = [e for e, _ in self._engine_keys() - exclude]
            if len(new) >= self.n:
                break
            now = time.monotonic()
            if self.engines == "slurm" and (now >= next_look or now > deadline):
                self._check_slurm_job(len(new), now > deadline)
                next_look = now + SLURM_POLL_SECONDS
            if now > deadline:
                where = (f"the engines' Slurm job {self.slurm_job} runs; its output:\n{self.slurm_output()}"
                         if self.engines == "slurm" else f"the engines' log:\n{self.log_tail()}")
                raise TimeoutError(f"only {len(new)} of {self.n} engines registered within "
                                   f"{self.start_timeout:g} s (start_timeout); {where}")
            time.sleep(0.01)
        self.engine_ids = sorted(new)[: self.n]
        self._map_ranks()

    def _check_slurm_job(self, registered: int, timed_out: bool) -> None:
        """While the engines come up: a job that ended is an error with its Slurm output; one still
        pending at the timeout is cancelled and named with Slurm's reason."""
        slurm.check_engine_job(self.slurm_job, self.n, registered, timed_out, self.start_timeout,
                               self._slurm_output, self.slurm_output)

    def slurm_output(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the engines' Slurm job output (``engines="slurm"``); ``"(no output)"``
        when there is none, or no job.

        Args:
            lines: how many lines, from the end.
        """
        path = getattr(self, "_slurm_output", None)
        try:
            text = Path(path).read_text(errors="replace") if path else ""
        except OSError:
            text = ""
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    def _map_ranks(self) -> None:
        # execute + pull of plain code: a function defined in this package would be pickled
        # with a reference to its module, and unpickling it imports workbench (and torch, ~2 s)
        view = self.client[self.engine_ids]
        view.execute("import os, socket; from mpi4py import MPI as _wb_MPI; "
                     "_wb_rank = _wb_MPI.COMM_WORLD.Get_rank(); _wb_size = _wb_MPI.COMM_WORLD.Get_size(); "
                     "_wb_pid = os.getpid(); _wb_host = socket.gethostname()", block=False)
        pending = view.pull(("_wb_rank", "_wb_size", "_wb_pid", "_wb_host"), block=False)
        deadline = time.monotonic() + self.start_timeout
        while not pending.ready():  # get(timeout=...) waits in whole seconds: poll instead
            if time.monotonic() > deadline:
                raise TimeoutError(f"engines did not answer within {self.start_timeout:g} s (start_timeout)")
            time.sleep(0.005)
        ranks, sizes, pids, hosts = zip(*pending.get())
        self.ranks = dict(zip(view.targets, ranks))
        self.pids = dict(zip(ranks, pids))  # rank -> engine process id
        self.hosts = dict(zip(ranks, hosts))  # rank -> host name
        for old in guard_dir(self._ipp.cluster_id, self.files).glob("*.status"):  # ends of replaced engines
            old.unlink(missing_ok=True)
        if sorted(ranks) != list(range(self.n)):
            if self.engines == "slurm":
                raise ConfigError(slurm.not_one_job_message(self.n, sizes, "srun_args"))
            raise ConfigError(f"engines are not one MPI job: ranks {sorted(ranks)} of sizes {sorted(set(sizes))}; "
                              f"the engines' launcher ({self.engines}) gave them no common MPI job: check that "
                              "mpi4py uses the MPI library of that launcher (mpi_args / ipp_config)")
        self.engines_need_restart = False
        # warm up: import the training code in the background, so the first train() starts fast
        view.execute("import workbench.runtime.rank.sink", block=False)

    def local_ranks(self) -> dict[int, int]:
        """rank -> engine pid of the engines this process can see: all of a local cluster's and a
        virtual cluster's (its nodes share this host's process table), the ones on this host of a
        Slurm cluster (other batch systems: none)."""
        if self.engines == "mpi" or self.vcluster is not None:
            return dict(self.pids)
        if self.engines == "slurm":
            here = socket.gethostname()
            return {r: pid for r, pid in self.pids.items() if self.hosts.get(r) == here}
        return {}

    def dead_ranks(self) -> list[int]:
        """Ranks whose engine process is gone or a zombie (the engines this process can see:
        :meth:`local_ranks`; [] otherwise)."""
        return [rank for rank, pid in self.local_ranks().items() if not alive(pid)]

    def exits(self) -> list[dict]:
        """How this cluster's engines that ended did, the first to end first, as recorded by each
        engine's guard (:mod:`workbench.runtime.launch.rankguard`): dicts with ``rank``, ``pid``, ``host``,
        ``signal`` or ``exit_code``, ``time`` (unix seconds) and ``how`` (words). Local and Slurm
        engines (a Slurm engine's guard writes under ``$WORKBENCH_STATE_DIR``: on another node, only
        if that folder is on a shared file system)."""
        if self._ipp is None or self.engines not in ("mpi", "slurm"):
            return []
        current = set(self.pids.values())
        _, ends = rank_records(guard_dir(self._ipp.cluster_id, self.files))
        return [{**end, "how": describe_end(end)} for end in ends if end.get("pid") in current]

    def healthy(self) -> bool:
        """All of this cluster's engines are registered, none needs replacing and none went silent."""
        return (self.client is not None and not self.engines_need_restart
                and all(e in self.client.ids for e in self.engine_ids) and not self.lost())

    def failed_nodes(self) -> dict[str, str]:
        """Nodes of this cluster's engines that its batch system has taken out of service (Slurm:
        DOWN, DRAIN, FAIL, not responding), with Slurm's reason; {} otherwise."""
        if self.engines != "slurm" or not self.hosts:
            return {}
        return slurm.failed_nodes(set(self.hosts.values()))

    def lost(self, ranks: int | None = None) -> list[dict]:
        """Engines whose heartbeats stopped: their node was cut off or hung (engines on a virtual cluster;
        [] otherwise). See :mod:`workbench.runtime.launch.heartbeat`.

        Args:
            ranks: only ranks below this (the ranks a run uses); None: every engine.

        Returns:
            One dict per silent engine, its ``rank`` among the keys.
        """
        if self._heartbeats is None:
            return []
        return [s for s in self._heartbeats.silent() if ranks is None or s["rank"] < ranks]

    # -- where things are --------------------------------------------------------------------
    @property
    def files(self) -> Path:
        """The folder of this cluster's files (connection files, the guards' records, batch files): the
        state folder, or on a virtual cluster whose nodes do not see it, its shared folder's ``.workbench``."""
        if self.vcluster is None or self.vcluster.visible(state_dir()):
            return state_dir()
        return self.vcluster.shared / ".workbench"

    @property
    def listen_ip(self) -> str:
        """Where the controller and every run's live stream listen."""
        from .ipp_setup import listen_ip
        return listen_ip(self)

    @property
    def advertised_ip(self) -> str:
        """The address engines connect to."""
        from .ipp_setup import advertised_ip
        return advertised_ip(self)

    @property
    def heartbeat_env(self) -> dict[str, str]:
        """The environment that makes an engine on a virtual cluster send its heartbeats to this cluster's
        listener ({} elsewhere)."""
        return self._heartbeats.env if self._heartbeats is not None else {}

    def view(self):
        """A DirectView on this cluster's current engines (all MPI ranks); the cluster must be started."""
        return self.client[self.engine_ids]

    def restart_engines(self, room: tuple | None = None) -> None:
        """Replace the engines (after a failed or killed run): kill, start anew, reconnect.

        On a virtual cluster (mpiexec engines) they start on the nodes that answer the head: with a node lost,
        fewer engines (``n`` says how many; one line on stderr), with it back, as many as asked again
        (:func:`~.ipp_setup.engine_room`). The hub forgets the dead engines only after missed heartbeats, so
        we wait for ``n`` new engines (new uuids; Slurm engines may reuse the old ids) instead of for the old
        ones to go.

        Args:
            room: :func:`~.ipp_setup.engine_room`'s answer when the caller has it already (each look at a node
                that does not answer waits for its timeout): ``(n, nodes, lost)``, the engines to start, the
                node indices to start them on (None: where they ran) and the hostnames that do not answer.

        Raises:
            TimeoutError: fewer than ``n`` new engines registered within ``start_timeout`` seconds.
            RuntimeError: Slurm refused or ended the new engines' job.
        """
        from .ipp_setup import engine_mpi_args, engine_room
        old = frozenset(self._engine_keys())
        self.kill_engines()
        self._ipp.stop_engines_sync()
        n, nodes, lost = room or engine_room(self)
        if nodes is not None:
            self._ipp.config.MPIEngineSetLauncher.mpi_args = engine_mpi_args(self, n, nodes)
            self.n = self._ipp.n = n
            if lost:
                print(f"workbench: cluster {self._ipp.cluster_id}: {n} engines, {self.planned_n} asked: "
                      f"{', '.join(lost)} do not answer", file=sys.stderr, flush=True)
        if self._heartbeats is not None:
            self._heartbeats.restart(self.n)
        self._start_engines(exclude=old)

    def kill_engines(self) -> None:
        """SIGKILL this cluster's engines and mpiexec, or cancel its Slurm job (thread-safe: touches
        no ipyparallel state)."""
        if self._ipp is not None:
            if self.slurm_job:
                slurm.cancel([self.slurm_job], signal="KILL")
                slurm.cancel([self.slurm_job])
            kill([p for p in processes_of(self._ipp.cluster_id)
                   if "ipyparallel.controller" not in " ".join(cmdline(p))])
            remove_leftovers()
            self.engines_need_restart = True

    def stop(self) -> None:
        """Stop engines and controller and forget the cluster; nothing when it is not started. A run still
        going is cancelled first (5 s for its ranks to stop). What it takes: benchmarks/README.md, "Start,
        stop, dashboard overhead".

        The engines hold no state worth a polite shutdown (runs are in the store), so they are
        killed first; ipyparallel's own stop then only tidies up (its SIGTERM path would wait
        for mpiexec to forward the signal). The Slurm jobs are cancelled and waited for (up to 15 s),
        the cluster's record, files and sockets removed.
        """
        if self._ipp is None:
            return
        if self.active_run is not None and not self.active_run.done():
            self.active_run.cancel(timeout=5)
        try:
            if self.client is not None:
                self.client.close()
            self.kill_engines()
            self._ipp.stop_engines_sync()
            self._ipp.stop_controller_sync()
        finally:
            if self._slurm_jobs:  # gone from squeue before stop() returns
                slurm.cancel(self._slurm_jobs)
                slurm.wait_gone(self._slurm_jobs, timeout=15)
            kill(processes_of(self._ipp.cluster_id))  # anything that did not stop
            record_path(self._ipp.cluster_id).unlink(missing_ok=True)
            remove_files_of(self._ipp.cluster_id, self._ipp.cluster_file, self.files)
            remove_leftovers()
            self._ipp, self.client, self.ranks, self.engine_ids = None, None, {}, []
            self.slurm_job, self._slurm_jobs = None, []
            if self.sockets is not None:
                shutil.rmtree(self.sockets, ignore_errors=True)
                self.sockets = None
            if self._heartbeats is not None:
                self._heartbeats.close()
                self._heartbeats = None
            use_slurm_of(self, None)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines ipyparallel logged for this cluster (controller and engines'
        output included); kept out of the notebook unless something failed; ``"(nothing logged)"`` when empty.

        Args:
            lines: how many lines, from the end.
        """
        return "\n".join(self._log.lines[-lines:]) or "(nothing logged)"

    def _record(self) -> None:
        write_record(self._ipp.cluster_id, self._ipp.cluster_file, engines=self.engines, n=self.n, files=self.files,
                     slurm_jobs=self._slurm_jobs, sockets=self.sockets)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def cluster_id(self) -> str | None:
        """ipyparallel's id of the running cluster (its files and record are named by it); None when stopped."""
        return None if self._ipp is None else self._ipp.cluster_id

    def __repr__(self) -> str:
        state = "stopped" if self._ipp is None else f"running, id {self._ipp.cluster_id}"
        where = f" on vcluster {self.vcluster.name}" if self.vcluster is not None else ""
        short = f" of {self.planned_n} asked" if self.n != self.planned_n else ""  # engines that did not come back
        return f"<workbench.Cluster n={self.n}{short} engines={self.engines!r}{where} ({state})>"

    # -- training --------------------------------------------------------------------------
    def train(self, cfg: RunConfig, run_dir: str | os.PathLike | None = None, *, store=None,
              timeout: float = 3600.0, sweep_id: str | None = None, sweep_key: str | None = None):
        """Start training ``cfg`` on the engines and return a :class:`~workbench.runtime.client.run.Run`
        at once. The cluster is started if it is not, and its engines replaced if they are not healthy
        (:meth:`healthy`).

        With ``cfg.max_restarts``, a run that fails with a checkpoint behind it starts again from it on new
        engines, as one run. On a virtual cluster the new engines start on the nodes that answer; a run short
        of them goes on at fewer ranks, down to ``cfg.min_ranks`` (:meth:`~.run.Run._room`); elsewhere the
        engines start where they ran.

        Args:
            cfg: the run; ``cfg.ranks`` must be <= ``n`` (the first ``cfg.ranks`` ranks train).
            run_dir: the run's folder (default: a new one under the runs folder, named by the run id; on a
                virtual cluster under its shared folder); a folder that holds a run already is refused.
            store (Store | str | PathLike | None | bool): a :class:`~workbench.store.Store`, a path, or None
                for the default store; ``False`` records nothing.
            timeout: seconds before the run is cancelled.
            sweep_id: the sweep the run belongs to (:class:`~workbench.sweep.Sweep` sets it).
            sweep_key: the run's point in that sweep.

        Returns:
            (Run): The live run; ``run.wait()`` gives its :class:`~workbench.results.RunResult`.

        Raises:
            ConfigError: ``cfg`` is not a RunConfig, or asks for more ranks than the cluster has engines;
                ``run_dir`` is a file, holds a run already, cannot be created or written, or (on a virtual
                cluster) is not seen by its nodes.
            RuntimeError: the previous run on this cluster is still going (``wait()`` or ``cancel()`` it).
            TimeoutError: the engines did not register within ``start_timeout`` seconds as :meth:`start` or
                :meth:`restart_engines` brought them up (those raise the rest of what a start can meet).
        """
        from .run import Run
        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"cfg: expected a workbench.RunConfig, got {type(cfg).__name__}")
        if cfg.ranks > self.n:
            raise ConfigError(f"ranks: this cluster has {self.n} engines; ranks must be 1..{self.n}, "
                              f"got {cfg.ranks}")
        if self.active_run is not None and not self.active_run.done():
            raise RuntimeError(f"run {self.active_run.run_id} is still going: wait() or cancel() it first")
        self.start()
        if not self.healthy():
            self.restart_engines()
        self.active_run = Run(self, cfg, run_dir, store=store, timeout=timeout,
                              sweep_id=sweep_id, sweep_key=sweep_key)
        return self.active_run
