"""One run, several incarnations: what a run that starts again from its checkpoint after a fault keeps
(``RunConfig.max_restarts``), the same for a batch run (:class:`~.batch_run.BatchRun`: ``workbench train``)
and a notebook's run (:class:`~.run.Run`). A mixin of :class:`~.handle.RunHandle`:

- each incarnation's records and spans are moved onto the run's clock (its ranks count from their own
  start: :func:`shift` by when the incarnation was launched);
- each rank's ``resume`` record drops what that rank recorded after its checkpoint in the incarnation that
  failed, so every step is in the run once; the ranks' plans say when they are back (``recovery_seconds``);
- a fault is one dict in :attr:`Incarnations.restarts` and a ``fault`` record on the run's clock;
- at the end ``metrics.jsonl`` begins with what the failed incarnations kept, ``trace.json`` is on the run's
  clock, and ``summary.json`` names the restarts (``restarts``, ``incarnations``, ``world_sizes``) and counts
  the whole run: ``wall_seconds`` on its clock (the faults and restarts in it), ``bytes_sent`` over every
  incarnation (a failed one's as its ranks' last records had their byte counters: a worker's step, up to a
  second behind; a master's evaluation, up to a tenth of the run behind);
  the per-rank traffic fields (``wire_bytes``, ``..._per_step``) are the last incarnation's.
"""
from __future__ import annotations

import dataclasses
import json
import time

from ..live import records_in
from ..rank.checkpoint import marker


class Incarnations:
    """The bookkeeping of a run's incarnations (see the module's text). The class using it calls
    :meth:`_init_incarnations` once, :meth:`_launching` before each incarnation starts, :meth:`_take` with
    the ranks' messages, :meth:`_note_fault` after a failure it restarts from and :meth:`_write_incarnations`
    once the last incarnation has written the run's files."""

    def _init_incarnations(self) -> None:
        #: the faults this run came back from: one dict each, also in summary.json's ``restarts``
        self.restarts: list[dict] = []
        self._earlier: list[dict] = []  # records of the incarnations that failed, up to where the next went on
        self._since = 0  # records received before the newest incarnation began
        self._restarted_at: float | None = None  # when the newest restart was launched, until its ranks are back
        self._launched: list[float] = []  # when each incarnation was launched (this host's clock)

    def _launching(self) -> None:
        """An incarnation is about to start."""
        self._launched.append(time.time())

    def _offset(self) -> float:
        """Seconds from the first incarnation's launch to the newest one's: what puts the newest one's times
        on the run's clock (its setup taken as long as the first one's)."""
        return self._launched[-1] - self._launched[0] if self._launched else 0.0

    def _checkpointed(self) -> bool:
        """The run's folder holds a checkpoint a restart can start from."""
        return marker(self.run_dir, self.cfg.spec.master_based).exists()

    def _take(self, messages: list[dict]) -> None:
        """The ranks' messages received (:meth:`~.handle.RunHandle.receive`) on the run's clock; after a
        restart, each rank's ``resume`` record cuts what it had recorded after its checkpoint in the
        incarnation that failed, and the ranks' plans say when they are back."""
        if self.restarts:  # each incarnation's ranks count from their own start
            shift(messages, self._offset())
        self.receive(messages)
        if not self.restarts:
            return
        for record in records_in(messages)[0]:
            if record.get("kind") == "resume":
                unit = "arrivals" if "arrivals" in record else "step"
                with self._lock:
                    self._earlier = [r for r in self._earlier if r.get("rank") != record["rank"]
                                     or r.get(unit, -1) < record[unit] or r.get("kind") == "resume"]
        if self._restarted_at is not None and any("plan" in m for m in messages):
            self.restarts[-1]["recovery_seconds"] = round(time.time() - self.restarts[-1]["detected"], 3)
            self._restarted_at = None

    def _note_fault(self, rank: int | None, cause: str, step: int | None, world_size: int,
                    nodes_lost: list[str] = ()) -> dict:
        """A fault the run restarts from: ``rank`` and ``cause`` (one line), the checkpoint's ``step`` it goes
        on from (None: each rank's own), the ranks it goes on at and the nodes left out. Keeps the records so
        far for the merge and adds a ``fault`` record on the run's clock; returns the fault."""
        fault = {"incarnation": len(self.restarts) + 1, "detected": time.time(), "rank": rank, "cause": cause,
                 "resumed_from_step": step, "nodes_lost": list(nodes_lost), "world_size": world_size}
        self.restarts.append(fault)
        with self._lock:
            # each rank's byte counter as its last record had it (a step's, or a master's evaluation): what the
            # incarnation sent, short of what a rank sent after its last record
            sent: dict = {}
            for record in self._records[self._since:]:
                if "wire_bytes" in record:
                    sent[record.get("rank")] = max(sent.get(record.get("rank"), 0), record["wire_bytes"])
            fault["bytes_sent"] = sum(sent.values())
            self._earlier += self._records[self._since:]
            # the fault on the run's clock, for the loss curve, the timeline and the status line: in the records
            # the run is followed by while it goes on (history) and in those it keeps (metrics.jsonl, the store)
            record = {"kind": "fault", "t": round(fault["detected"] - self._launched[0], 3), "rank": rank,
                      "incarnation": fault["incarnation"], "cause": cause, "nodes_lost": fault["nodes_lost"],
                      "world_size": world_size}
            self._earlier.append(record)
            self._records.append(dict(record))
            self._since = len(self._records)
        self._restarted_at = fault["detected"]
        return fault

    def _write_incarnations(self) -> None:
        """metrics.jsonl begins with what the failed incarnations recorded before each rank went on, the
        newest incarnation's records and trace.json on the run's clock, and summary.json names the restarts
        (``restarts``, ``incarnations``, ``world_sizes``)."""
        if not self.restarts:
            return
        metrics = self.run_dir / "metrics.jsonl"
        kept = "".join(json.dumps(r) + "\n" for r in self._earlier)
        newest = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
        shift([{"metrics": newest}], self._offset())  # rank 0 wrote them on the newest incarnation's clock
        metrics.write_text(kept + "".join(json.dumps(r) + "\n" for r in newest))
        trace_path = self.run_dir / "trace.json"
        if trace_path.exists():
            trace = json.loads(trace_path.read_text())
            shift([{"spans": [e for e in trace.get("traceEvents", []) if "ts" in e]}], self._offset())
            trace_path.write_text(json.dumps(trace))
        summary_path = self.run_dir / "summary.json"
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            summary.update(restarts=self.restarts, incarnations=len(self.restarts) + 1,
                           world_sizes=self.world_sizes,
                           # the whole run: on its clock, faults and restarts in; every incarnation's bytes
                           wall_seconds=round(self._offset() + summary["wall_seconds"], 3),
                           bytes_sent=summary["bytes_sent"] + sum(f["bytes_sent"] for f in self.restarts))
            summary_path.write_text(json.dumps(summary, indent=1))

    @property
    def world_sizes(self) -> list[int]:
        """The ranks of each incarnation so far, the first's first (``summary.json``'s ``world_sizes``)."""
        return [self.cfg.ranks, *(fault["world_size"] for fault in self.restarts)]

    def _said(self) -> list[str]:
        """The repr's words (:meth:`~.handle.RunHandle._said`) and the restarts with the ranks of each
        incarnation."""
        said = super()._said()  # type: ignore[misc]  # a mixin of RunHandle
        if self.restarts:
            said.append(f"{len(self.restarts)} restart{'s' * (len(self.restarts) != 1)} "
                        f"(ranks {'->'.join(map(str, self.world_sizes))})")
        return said

    def _at(self, ranks: int):
        """The run's configuration at ``ranks`` ranks: its own, or fewer with ``planned_ranks`` (its steps and
        schedule as planned: ``min_ranks``)."""
        cfg = self.cfg
        return cfg if ranks == cfg.ranks else dataclasses.replace(cfg, ranks=ranks, planned_ranks=cfg.ranks)

    def _no_room_for(self, ranks: int, nodes: int, lost: list[str], why: str, option: str) -> str | None:
        """Why there is no restart when the ``nodes`` left (``lost`` ``why``) hold ``ranks`` ranks, fewer than
        ``min_ranks`` or, without it, the run's own (``option``: how the user sets min_ranks); None when
        there is room."""
        cfg = self.cfg
        floor = cfg.min_ranks if cfg.min_ranks is not None else cfg.ranks
        if ranks >= floor:
            return None
        return (f"(no restart: {', '.join(lost) or 'no node'} {why}, and the {nodes} nodes left hold {ranks} ranks, "
                "fewer than " + (f"min_ranks {floor})" if cfg.min_ranks is not None else
                                 f"the run's {floor}; {option} lets it go on with fewer)"))

    def _restarts_named(self, error: str) -> str:
        """``error`` with every earlier fault named (a run that exhausted its restarts)."""
        if not self.restarts:
            return error
        return (f"{error}\n(the run had restarted {len(self.restarts)} times before: "
                + "; ".join(f"fault {f['incarnation']}: {f['cause']}" for f in self.restarts) + ")")


def shift(messages: list[dict], seconds: float) -> None:
    """Move the records' ``t`` (seconds) and the spans' ``ts`` (microseconds) of live-channel ``messages``
    ``seconds`` later, in place."""
    if not seconds:
        return
    for message in messages:
        for record in message.get("metrics", ()):
            if "t" in record:
                record["t"] += seconds
        for span in message.get("spans", ()):
            span["ts"] += seconds * 1e6


def resized(before, after) -> str:
    """One line: how a run that goes on at ``after.ranks`` instead of ``before.ranks`` trains (what stays as
    planned, what follows the size)."""
    rows = lambda cfg: cfg.batch_size * cfg.workers  # noqa: E731 - the rows one step of every worker takes
    hyper, was = after.hyper, before.hyper
    line = (f"it goes on at {after.ranks} ranks ({before.ranks} before): the same steps and {after.batch_size} rows "
            f"a worker a step, so a step takes {rows(after)} rows (was {rows(before)}) and the steps left see "
            f"{after.workers}/{before.workers} of the rows they would have; an epoch counts the steps as planned; "
            f"learning rate {hyper.lr:g} as planned")
    if after.spec.elastic and hyper.rho != was.rho:
        line += f"; rho {was.rho:.4g} -> {hyper.rho:.4g} (beta = p*lr*rho stays {after.workers * hyper.lr * hyper.rho:.2g})"
    return line

