"""A training run going on in a cluster's engines, seen from the notebook.

``cluster.train(cfg)`` returns a :class:`Run` at once. A receiver thread takes the ranks' live
channel (:mod:`workbench.runtime.live`; here a signed ZeroMQ stream, :mod:`workbench.runtime.rank.sink`)
into ``run.history`` / ``run.trace``, tells observers (the dashboard) and appends the metrics to the results store as they come, so an interrupted run
keeps its history. When the engines finish, the run's files (written by rank 0) become the
:class:`~workbench.results.RunResult` that ``run.wait()`` returns and the store keeps.

Failure and cancellation never hang the notebook:
- a rank that raises pushes its traceback first; the other ranks get ``GRACE_SECONDS`` to finish
  and are then killed (they may be stuck in a collective), and ``wait()`` raises :class:`RunError`
  naming the rank; the engines are restarted so the cluster stays usable;
- an engine process that dies (a signal, the out-of-memory killer, a crash in C) is named with its
  pid, host and how it ended (signal or exit code), from the record its guard writes
  (:mod:`workbench.runtime.launch.rankguard`); errors that other ranks report after it are consequences
  and are shown as such, never blamed;
- ``cancel()`` writes ``<run_dir>/CANCEL``; the ranks agree to stop at the next evaluation point
  (synchronous algorithms) or exchange (master-based ones) and the run ends as ``cancelled`` with
  its summary; ranks that do not stop within the timeout are killed;
- interrupting the kernel inside ``wait()`` cancels the run.
"""
from __future__ import annotations

import secrets
import sys
import threading
import time
from collections import deque
from pathlib import Path

import zmq

from ...config import RunConfig
from ...results import RunResult
from ..rundir import CANCEL_FILE, make_run_dir, run_id_for, runs_root
from ..launch.blame import first_cause, who_is
from ..rank.checkpoint import latest_step
from ..stream import MAX_MESSAGE_BYTES, new_secret, verify
from .engines import Engines
from .handle import RunError, RunHandle, expected_steps, open_store
from .incarnations import Incarnations, resized

GRACE_SECONDS = 3.0
#: seconds an engine may be dead while the run goes on before the others are stopped (a whole MPI
#: job ends within about a second of losing a rank; one that does not is stuck)
DEAD_GRACE_SECONDS = 5.0
STORE_EVERY_SECONDS = 1.0

__all__ = ["Run", "RunError", "expected_steps"]


class Run(Incarnations, RunHandle):
    """A live run (a :class:`~.handle.RunHandle`) on a cluster's engines (an :class:`~.engines.Engines`
    launcher), its records coming on a signed ZeroMQ stream. ``history`` (DataFrame) and ``trace`` (list
    of spans) grow while it trains. With ``cfg.max_restarts``, a run that fails with a checkpoint behind it
    starts again from it on new engines, as one run (:class:`~.incarnations.Incarnations`). Made by
    :meth:`Cluster.train <workbench.runtime.client.cluster.Cluster.train>`, whose arguments it takes.

    Attributes:
        run_id (str): the run's id, unique in its store (the run folder's name unless the store holds that one).
        cfg (RunConfig): the :class:`~workbench.config.RunConfig`; ``config``: the same as a dict.
        run_dir (Path): the run's folder: ``config.json``, and the files rank 0 writes at the end.
        store (Store | None): the :class:`~workbench.store.Store` it is recorded in (None: nowhere).
        error (str | None): why it failed (a rank's traceback, or how its engine ended), else None.
        failed_rank (int | None): the rank blamed for the failure (None: unknown, or none failed).
        result (RunResult | None): the :class:`~workbench.results.RunResult` once it ended; ``summary``: its summary.
        restarts (list[dict]): the faults it came back from, one dict each (``summary.json``'s ``restarts``).
        started (float): when it was launched (unix seconds).
        latencies (deque[float]): seconds from a rank's send to the notebook's receipt, per message (the last 100 000).
        rejected_messages (int): live-stream messages dropped because they were not signed with this run's secret.
    """

    def __init__(self, cluster, cfg: RunConfig, run_dir=None, *, store=None, timeout: float = 3600.0,
                 sweep_id: str | None = None, sweep_key: str | None = None) -> None:
        self.cluster, self.cfg = cluster, cfg
        store = open_store(store)
        # a unique id in the store whatever the folder is called; a folder that holds a run is refused
        run_id = run_id_for(run_dir, cfg, store)
        if cluster.vcluster is not None:  # rank 0 writes the run's files, every rank reads CANCEL there
            from ..launch.batch import check_visible, runs_folder
            run_dir = Path(run_dir) if run_dir is not None else runs_folder(cluster.vcluster) / run_id
            check_visible(cluster.vcluster, {"run_dir": run_dir})
        run_dir = make_run_dir(Path(run_dir if run_dir is not None else runs_root() / run_id)).resolve()
        super().__init__(run_id, cfg.to_dict(), run_dir, store, expected_steps(cfg))
        (self.run_dir / "config.json").write_text(cfg.to_json())
        self._first_dead: int | None = None  # the rank whose engine was seen dead first
        self._killed = False  # this run killed the engines itself (deaths after that are ours)
        self.latencies: deque[float] = deque(maxlen=100_000)  # seconds from rank send to receipt
        self._cancel_requested = False
        self._init_incarnations()
        self._pending_fault: str | None = None  # a failure a restart may come back from, until it is decided
        self._pending_outcome: str | None = None  # how the newest incarnation ended, decided before a restart
        self._now = cfg  # the newest incarnation's configuration (fewer ranks after a node was lost: min_ranks)
        self._next: tuple[RunConfig, list[str]] | None = None  # the next one's, and the nodes it leaves out
        self._no_room: str | None = None  # why a failure is not restarted from: too few nodes answer
        self._room_now = None  # where the next incarnation's engines go (ipp_setup.engine_room), found once
        self._timeout = timeout
        self.started = time.time()
        self._record_start(sweep_id=sweep_id, sweep_key=sweep_key)
        self.rejected_messages = 0  # live-stream messages dropped: not signed with this run's secret
        self._secret = new_secret()
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if cluster.sockets is not None:  # engines in a network of their own: a Unix socket in a 0700 folder
            address = f"ipc://{cluster.sockets}/live-{secrets.token_hex(4)}"  # a path: <= 107 bytes
            self._socket.bind(address)
        else:
            port = self._socket.bind_to_random_port(f"tcp://{cluster.listen_ip}")
            address = f"tcp://{cluster.advertised_ip}:{port}"
        self.address = address  # the live stream (signed messages only)
        self.launcher = Engines(cluster, self.config, str(self.run_dir), address, self.run_id, self._secret)
        self._launching()
        self.launcher.start()
        self._thread = threading.Thread(target=self._follow, name=f"run-{self.run_id}", daemon=True)
        self._thread.start()

    # -- what the notebook sees ------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> RunResult:
        """Block until the run ends and return its :class:`RunResult`. Interrupting the kernel here
        cancels the run (and re-raises ``KeyboardInterrupt``).

        Args:
            timeout: seconds to wait at most (None: until it ends).

        Raises:
            TimeoutError: after ``timeout`` seconds; the run goes on (``wait()`` again, or ``cancel()`` it).
            RunError: a rank failed; the error names the rank (``rank``) and holds its traceback.
        """
        try:
            self._wait_done(timeout)
        except KeyboardInterrupt:
            self.cancel()
            raise
        self._restart_if_needed()
        return self._outcome()

    def cancel(self, timeout: float = 30.0) -> RunResult | None:
        """Ask the ranks to stop at their next evaluation point or exchange (a run that ended is left as it
        is), kill them if they have not within ``timeout`` seconds, and return :attr:`result` (None if they
        could not be ended).

        Args:
            timeout: seconds the ranks have to stop before they are killed.
        """
        if not self.done():
            self._cancel_requested = True
            (self.run_dir / CANCEL_FILE).write_text(str(time.time()))
            if not self._done.wait(timeout):
                self._hard_stop("cancelled", f"cancelled; ranks did not stop within {timeout:g} s and were killed")
                self._done.wait(GRACE_SECONDS + 5)
        self._restart_if_needed()
        return self.result

    def _restart_if_needed(self) -> None:
        # engines whose node stopped answering, or that the batch system took out, cannot come back
        # now: the next train() restarts them
        if (self.cluster.engines_need_restart and self.cluster.active_run is self and not self.cluster.lost()
                and not self.cluster.failed_nodes()):
            self.cluster.restart_engines()

    # -- receiver thread -------------------------------------------------------------------
    def _follow(self) -> None:
        """The receiver thread: each incarnation watched (:meth:`_watch`), the next one started while a
        restart is allowed (:meth:`_restarted`), then the end recorded."""
        try:
            deadline = time.monotonic() + self._timeout
            while True:
                self._watch(deadline)
                if not self._restarted():
                    break
            self._finish()
        except BaseException as exc:  # noqa: BLE001 - never leave wait() hanging
            self._receiver_failed(exc)
        finally:
            self._socket.close(linger=0)

    def _watch(self, deadline: float) -> None:
        """Until the engines have returned or were stopped: the stream drained, the store kept, the engines'
        health watched."""
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        fail_deadline = None
        next_store = time.monotonic() + STORE_EVERY_SECONDS
        next_health_check = 0.0
        dead_since = None
        while True:
            if poller.poll(20):
                self._drain()
            now = time.monotonic()
            if self.store is not None and now >= next_store:
                self._store_records()
                next_store = now + STORE_EVERY_SECONDS
            if now >= next_health_check:
                # MPI kills the whole job when one engine dies, about a second later: a
                # rank seen dead alone is the one that died first
                dead = self.launcher.dead()
                if self._first_dead is None:
                    self._first_dead = dead[0] if len(dead) == 1 else None
                dead_since = dead_since if dead else None
                dead_since = dead_since or (now if dead else None)
                next_health_check = now + 0.02
                if dead_since is not None and now - dead_since > DEAD_GRACE_SECONDS and not self.launcher.ended():
                    # engines died and the others did not end: they wait in MPI for the dead
                    self._hard_stop("failed", f"engines of ranks {dead} died and the run did not end; it was "
                                              "stopped")
                    break
                lost = self.cluster.lost(self._now.ranks)
                if lost:  # a node cut off or hung: nothing will end by itself
                    from ..launch.heartbeat import describe
                    self._hard_stop("failed", f"{describe(lost, self.cluster.hosts)}; the run was stopped")
                    self.failed_rank = lost[0]["rank"]
                    break
            if self.launcher.ended():
                self._drain()
                break
            if self.failed_rank is not None and fail_deadline is None:
                fail_deadline = now + GRACE_SECONDS
            if fail_deadline is not None and now > fail_deadline:
                self._hard_stop("failed", self.error)  # the others are stuck in a collective
                break
            if now > deadline and not self._cancel_requested:
                self._cancel_requested = True
                (self.run_dir / CANCEL_FILE).write_text("timeout")
                fail_deadline = now + 30.0
                self.error = f"run timed out after {self._timeout:g} s and was cancelled"

    def _may_restart(self) -> bool:
        """A failure now would be come back from: restarts left, not cancelled, a checkpoint there, and room
        for the next incarnation (:meth:`_room`, kept in ``_next``)."""
        if len(self.restarts) >= self.cfg.max_restarts or self._cancel_requested or not self._checkpointed():
            return False
        self._next = self._room()
        return self._next is not None

    def _room(self) -> tuple[RunConfig, list[str]] | None:
        """The next incarnation's configuration and the nodes it leaves out. On a virtual cluster (mpiexec
        engines), the engines start again on the nodes that answer (:func:`~.ipp_setup.engine_room`): a run
        short of them goes on at fewer ranks, down to ``min_ranks`` (``planned_ranks``: its steps as planned),
        and with fewer than that there is no restart (the reason added to ``error``). Elsewhere the engines
        start again where they ran, unless their node is lost (None)."""
        from .ipp_setup import engine_room
        self._room_now = n, nodes, lost = engine_room(self.cluster)  # what restart_engines starts
        if nodes is None:
            return None if self.cluster.lost() or self.cluster.failed_nodes() else (self.cfg, [])
        ranks = min(self.cfg.ranks, n)
        self._no_room = self._no_room_for(ranks, len(nodes), lost, "do not answer", "min_ranks")
        return None if self._no_room else (self._at(ranks), lost)

    def _restarted(self) -> bool:
        """After an incarnation ended: if it failed and :meth:`_may_restart`, the fault noted (one line on
        stderr), new engines started and the run launched on them from its checkpoint; False otherwise
        (the run ends as the incarnation did)."""
        if self.status != "running":
            return False
        if self._pending_fault is None:
            self._pending_outcome = self._ending()
            if self._pending_outcome != "failed" or not self._may_restart():
                return False
        error, rank = self._pending_fault or self.error or "failed", self.failed_rank
        step = None if self.cfg.spec.master_based else latest_step(self.run_dir)
        before, (cfg, lost) = self._now, self._next
        fault = self._note_fault(rank, error.splitlines()[0], step, cfg.ranks, lost)
        print(f"workbench: run {self.run_id}: fault {fault['incarnation']} of at most {self.cfg.max_restarts}: "
              f"{fault['cause'].rstrip('.')}; restarting from its checkpoint" + (f" at step {step}" if step is not None else "")
              + f" on {cfg.ranks} new engines" + (f" ({', '.join(lost)} left out: not answering)" if lost else "")
              + f" (incarnation {fault['incarnation'] + 1})", file=sys.stderr, flush=True)
        if cfg.ranks != before.ranks:
            print(f"workbench: run {self.run_id}: {resized(before, cfg)}", file=sys.stderr, flush=True)
        self.error = self.failed_rank = self._first_dead = self._pending_fault = self._pending_outcome = None
        self._killed, self._now = False, cfg
        self.launcher.stop()
        self.cluster.restart_engines(self._room_now)
        self.launcher = Engines(self.cluster, cfg.to_dict(), str(self.run_dir), self.address, self.run_id,
                                self._secret, resume=str(self.run_dir))
        self._launching()
        self.launcher.start()
        return True

    def _receiver_failed(self, exc: BaseException) -> None:
        """The receiver raised: the run is failed, with the first failure as its cause, and ended in the
        store too (a failed run never stays ``running`` there), whatever its clean-up met."""
        why = f"workbench: the run's receiver failed: {exc!r}"
        if self.status == "failed":  # final: the first failure stays the cause
            self.error = f"{self.error}\n{why}"
        else:
            self._transition("failed", why)
        if not self._done.is_set():
            try:
                self._end()
            finally:
                self._done.set()

    def _drain(self) -> None:
        """The stream's messages so far, each checked and then received (:meth:`~.handle.RunHandle.receive`)."""
        messages = []
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            message = verify(self._secret, frames, self.run_id)
            if message is None:  # not from this run's ranks: dropped unread
                self.rejected_messages += 1
                continue
            self.latencies.append(time.time() - message["sent"])
            messages.append(message)
        self._take(messages)  # on the run's clock, after a restart

    def _hard_stop(self, status: str, error: str | None) -> None:
        """Stop the run as ``status`` (unless it was stopped already) and kill its engines."""
        if self.status == "running":
            # a death is looked for before our own kill adds deaths of its own
            blame = self._dead_engine() if status == "failed" else None
            if blame is not None:
                self.failed_rank, error = blame
            if status == "failed" and self._may_restart():
                self._pending_fault = error or self.error  # :meth:`_restarted` comes back from it
            else:
                self._transition(status, self._final_error(error) if error else error, if_running=True)
        self._killed = True
        self.launcher.stop()

    def _final_error(self, error: str) -> str:
        """The error a run ends with: every earlier fault named, and why it did not restart (too few nodes)."""
        return self._restarts_named(error + (f"\n{self._no_room}" if self._no_room else ""))

    def _dead_engine(self) -> tuple[int | None, str] | None:
        """If an engine process died, the first to die as the cause: (its rank, how it died, with its
        pid and host); a rank that reported an error after it was only hit by its death. None if none did.

        Engines die only when something outside Python kills them (a signal, the out-of-memory
        killer, a crash in C); an exception in a rank leaves its engine running. So the first
        death, as recorded by each engine's guard (:mod:`workbench.runtime.launch.rankguard`), is the
        cause, whatever the other ranks reported after it. Looked at before this run kills any
        engine itself.
        """
        if self._killed:
            return None
        _, exits = self.launcher.records()  # without those killed as their job ended
        first = first_cause(exits, abort_kills_all=self.launcher.abort_kills_all,
                            launcher_signals=self.launcher.stop_signals) or (exits[0] if exits else None)
        failed = self.cluster.failed_nodes()
        if failed:  # the batch system lost a node: that, not the ranks it then killed, is the cause
            on = {r: h for r, h in self.cluster.hosts.items() if h in failed}
            rank = min(on) if on else None
            text = "; ".join(f"node {node} failed ({why})" + (f": rank {', '.join(str(r) for r in sorted(on) if on[r] == node)} "
                                                              "ran there" if node in on.values() else "")
                             for node, why in failed.items())
            text += "; the batch system ended the engines' job, and with it the other ranks."
        elif first is not None:
            rank = first["rank"]
            text = (f"{who_is(rank, first['host'], first['pid'])} {first['how']}: its engine died "
                    "(killed from outside Python, out of memory, or a crash in C); MPI then stopped the "
                    "other ranks.")
        elif self._first_dead is not None:  # no record (its guard was killed too): seen dead alone
            rank = self._first_dead
            text = (f"{who_is(rank, self.cluster.hosts.get(rank), self.cluster.pids.get(rank))} died: its "
                    "engine was killed, ran out of memory or crashed outside Python; MPI then stopped the "
                    "other ranks.")
        else:
            return None
        if self.error and self.failed_rank != rank:
            text += f"\nAfter it died, rank {self.failed_rank} reported:\n{self.error}"
        return rank, text

    def _ending(self) -> str:
        """How a run whose engines returned ended: ``failed`` (the cause named in ``failed_rank`` and
        ``error``), ``cancelled`` or ``finished`` (with its result, read from the run's files)."""
        blame = self._dead_engine()
        if blame is not None:
            self.failed_rank, self.error = blame
        died = blame is not None
        if self.failed_rank is None:
            rank, text, died_unrecorded = self.launcher.error()
            died = died or died_unrecorded
            if text:
                self.failed_rank, self.error = rank, text
        if died:
            self.launcher.stop()  # MPI lost a rank: the rest of the job is gone or stuck
        if self.error and not self._cancel_requested:
            return "failed"
        if not (self.run_dir / "summary.json").exists():
            self.error = self.error or "the engines returned no summary"
            return "failed"
        self._write_incarnations()  # a restarted run's files: every incarnation, on its clock
        self.result = RunResult.from_run_dir(self.run_dir, self.run_id)
        self.summary = self.result.summary
        return "cancelled" if self.summary.get("cancelled") or self._cancel_requested else "finished"

    def _finish(self) -> None:
        if self.status == "running":  # the engines returned (cleanly or with an error)
            outcome = self._pending_outcome or self._ending()
            if outcome == "failed" and self.error:
                self.error = self._final_error(self.error)
            self._transition(outcome, if_running=True)  # unless cancel() stopped it meanwhile
        self._end()
