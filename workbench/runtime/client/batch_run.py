"""A batch run: ``workbench train`` and ``workbench compare`` hold the run they launch as a
:class:`BatchRun`, the same :class:`~.handle.RunHandle` a notebook's run is, with its ranks under a batch
launcher (:mod:`workbench.runtime.launch.launcher`: mpiexec on this machine or a virtual cluster's
nodes, srun inside a Slurm allocation) and its records coming from the ranks' live files
(:mod:`workbench.runtime.live`). It runs in the foreground (:meth:`BatchRun.run`: the launcher handles
SIGINT, SIGTERM and SIGHUP from the main thread) and is recorded in the store whatever ends it: a
``running`` row before the ranks start (a crash leaves a trace), the records as they come, then the
finished run, or the failure and its error with the records so far.

No MPI in this process.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ...config import RunConfig
from ...results import RunResult
from ..live import LIVE_FOLDER
from ..rank.checkpoint import latest_step
from ..launch.signals import deferred_signals, signals_ignored
from .handle import RunHandle, expected_steps
from .incarnations import Incarnations, resized


class BatchRun(Incarnations, RunHandle):
    """``cfg`` run in ``run_dir`` under a batch launcher (``launch``: the keyword arguments of
    :func:`workbench.runtime.launch.batch.train`: ``launcher``, ``srun_args``, ``vcluster``, ``ppn``,
    ``resume``, ``timeout``), recorded in ``store`` as ``run_id``. ``resumed_from``: the run it continues
    (its id, or its folder); ``progress``: a progress bar on stderr while it runs."""

    kind = "BatchRun"

    def __init__(self, store, run_id: str, cfg: RunConfig, run_dir, *, resumed_from: str | None = None,
                 progress: bool = False, **launch) -> None:
        try:
            total = expected_steps(cfg)
        except Exception:  # noqa: BLE001 - a data set only the nodes read: no total known here
            total = None
        super().__init__(run_id, cfg.to_dict(), Path(run_dir).resolve(), store, total)
        self.cfg, self.resumed_from, self.show_progress, self.launch = cfg, resumed_from, progress, launch
        self._init_incarnations()
        self._lost: list[str] = []  # the nodes the newest restart leaves out, and why
        self._why_lost = "not answering"

    def _on_messages(self, messages: list[dict]) -> None:
        """A consumer of :func:`~workbench.runtime.live.following`: the new messages taken on the run's clock
        (:meth:`~.incarnations.Incarnations._take`), their records stored."""
        self._take(messages)
        self._store_records()

    def run(self) -> RunResult:
        """Start the ranks, wait for them (in this thread), record the end; the finished run's
        :class:`~workbench.results.RunResult`.

        Raises what the launch raised (:class:`~workbench.runtime.launch.blame.MPILaunchError` naming the
        rank, ...) with the run recorded as failed. Interrupted (SIGINT, SIGTERM, SIGHUP: the launcher has
        stopped the job), the run is recorded as its folder says: with its summary when rank 0 wrote one in
        this run (``cancelled``, or ``finished`` if it ended before the signal took effect), else
        ``cancelled`` with the signal as its error; never left ``running``. The exception goes on with
        ``recorded_status`` set. Store writes are not cut short by a signal."""
        from ..live import ProgressBar
        started = time.time()
        bar = ProgressBar(f"{self.run_id} ({self.cfg.algorithm})") if self.show_progress else None
        try:
            with deferred_signals():
                self._record_start(resumed_from=self.resumed_from)
            try:
                self._incarnations([self._on_messages, *([bar] if bar else [])])
            finally:
                if bar is not None:
                    bar.close()
            result = RunResult.from_run_dir(self.run_dir, self.run_id)
            with deferred_signals():
                self._transition(result.status)
                self._end(result)
            return result
        except KeyboardInterrupt as exc:
            with signals_ignored():  # stopping already: a second signal must not leave the row running
                exc.recorded_status = self._interrupted(started, exc)
            raise
        except BaseException as exc:
            with signals_ignored():
                # the launcher's blame names the rank (the first to end), not the first to report an error
                ranks = getattr(exc, "failed_ranks", None)
                self.failed_rank = ranks[0] if ranks else None
                self._failed(str(exc))
            raise

    def _incarnations(self, watch: list) -> None:
        """The run's ranks, started again from the newest checkpoint after each failure while ``max_restarts``
        allows (one line on stderr a fault), on the nodes that answer (:meth:`_placement`); then the earlier
        incarnations' records, up to where each rank went on, and the restarts written into the run's files.
        Raises the last failure when none is left."""
        from ..launch.batch import train
        from ..launch.blame import MPILaunchError
        launch, cfg = dict(self.launch), self.cfg
        try:
            while True:
                try:
                    self._launching()
                    train(cfg, self.run_dir, watch=watch, restart=bool(self.restarts), **launch)
                    break
                except MPILaunchError as exc:
                    if (len(self.restarts) >= self.cfg.max_restarts or not self._checkpointed()
                            or not getattr(exc, "restartable", True)):
                        exc.args = (self._restarts_named(str(exc)),)  # every fault named, the last one first
                        raise
                    before, cfg = cfg, self._placement(exc, launch)
                    self._restart(exc, before, cfg)
                    launch["resume"] = self.run_dir
        finally:
            if cfg is not self.cfg:  # the run's folder says the run as it was asked for (its summary: each size)
                (self.run_dir / "config.json").write_text(self.cfg.to_json())
        self._write_incarnations()

    def _placement(self, exc, launch: dict) -> RunConfig:
        """The next incarnation's configuration, its nodes put in ``launch``: on a virtual cluster the nodes that
        answer now (:meth:`_on_vcluster`), inside a Slurm allocation those it still holds (:meth:`_in_allocation`),
        elsewhere the run's own size (mpiexec on this machine: the machine is there). A run short of nodes goes
        on at fewer ranks, down to ``min_ranks`` (``planned_ranks``: its steps stay as planned). Raises ``exc``,
        saying why, when too few ranks are left."""
        self._lost = []
        room = self._on_vcluster(launch) if launch.get("vcluster") is not None else self._in_allocation(launch)
        if room is None:
            return self.cfg
        ranks, nodes = room
        why = "do not answer" if launch.get("vcluster") is not None else "left the Slurm allocation"
        no_room = self._no_room_for(ranks, nodes, self._lost, why, "--min-ranks M")
        if no_room:
            exc.args = (f"{exc}\n{no_room}",)
            raise exc
        return self._at(ranks)

    def _on_vcluster(self, launch: dict) -> tuple[int, int]:
        """(ranks, nodes) a restart on the virtual cluster has room for: the nodes that answer the head now, as
        many as the run needs (a lost node is left out, one that is back is used again), put in ``launch``."""
        from ...vcluster import VirtualCluster
        vcluster, cfg = launch["vcluster"], self.cfg
        vc = VirtualCluster.attach(vcluster) if isinstance(vcluster, str) else vcluster
        ppn = launch.get("ppn", 1)
        up = vc.answering()
        launch["nodes"] = up[:-(-cfg.ranks // ppn)]
        self._lost = [vc.hostnames[i] for i in range(vc.nodes) if i not in up]
        return min(cfg.ranks, len(launch["nodes"]) * ppn), len(up)

    def _in_allocation(self, launch: dict) -> tuple[int, int] | None:
        """(ranks, nodes) a restart inside the current Slurm allocation has room for: the nodes it still holds
        (a node that failed in an ``sbatch --no-kill`` job leaves it for good), as many ranks a node as the run
        had (``srun --nodes`` put in ``launch``); None outside an allocation or with every node still held."""
        from ..launch import slurm
        from ..launch.mpiexec import default_launcher
        if (launch.get("launcher") or default_launcher()) != "srun" or not slurm.in_allocation():
            return None
        planned, held = slurm.allocation_nodes(), slurm.held_nodes()
        self._lost = [node for node in planned if node not in held] if held else []
        self._why_lost = f"no longer in Slurm job {os.environ.get('SLURM_JOB_ID')}"
        if not self._lost:
            return None
        launch["srun_args"] = [*self.launch.get("srun_args", ()), f"--nodes={len(held)}"]
        return min(self.cfg.ranks, len(held) * -(-self.cfg.ranks // len(planned))), len(held)

    def _restart(self, exc, before: RunConfig, cfg: RunConfig) -> None:
        """Note the fault ``exc`` (its rank, its cause, when, the nodes lost, the size the run goes on at:
        ``cfg`` after ``before``) and keep the records so far for the merge."""
        ranks = getattr(exc, "failed_ranks", None) or []
        step = None if self.cfg.spec.master_based else latest_step(self.run_dir)
        fault = self._note_fault(ranks[0] if ranks else None, str(exc).splitlines()[0] if str(exc) else
                                 type(exc).__name__, step, cfg.ranks, self._lost)
        # the failed incarnation's live files kept aside: the next one's ranks start theirs afresh
        live = self.run_dir / LIVE_FOLDER
        if live.is_dir():
            live.rename(self.run_dir / f"{LIVE_FOLDER}.{fault['incarnation']}")
        print(f"workbench train: run {self.run_id}: fault {fault['incarnation']} of at most {self.cfg.max_restarts}: "
              f"{fault['cause']}; restarting from its checkpoint"
              + (f" at step {step}" if step is not None else "") + f" on {cfg.ranks} ranks"
              + (f" ({', '.join(fault['nodes_lost'])} left out: {self._why_lost})" if fault["nodes_lost"] else "")
              + f" (incarnation {fault['incarnation'] + 1})", file=sys.stderr, flush=True)
        if cfg.ranks != before.ranks:
            print(f"workbench train: run {self.run_id}: {resized(before, cfg)}", file=sys.stderr, flush=True)

    def _failed(self, error: str, status: str = "failed") -> None:
        """The run ended without a result: ``status`` with ``error``, in the store too (its records kept)."""
        self._transition(status, error, if_running=True)
        try:
            if self.store is not None:
                self._store_records()
                self.store.fail(self.run_id, error, status=status)
        finally:
            self._done.set()
            for obs in list(self._observers):
                obs.on_finish(self)

    def _interrupted(self, started: float, exc: BaseException) -> str:
        """Record an interrupted run from its folder; returns the status recorded."""
        try:
            # written by this run (a few seconds' slack: rank 0 may write on another host's clock)
            if Path(self.run_dir, "summary.json").stat().st_mtime >= started - 5:
                result = RunResult.from_run_dir(self.run_dir, self.run_id)
                self._transition(result.status, if_running=True)
                self._end(result)
                return result.status
        except (OSError, ValueError, KeyError):  # no summary, or one cut short by the kill
            pass
        self._failed(str(exc) or "interrupted from the keyboard", status="cancelled")
        return "cancelled"

