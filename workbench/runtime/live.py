"""A batch run's metric records while it runs, through its run folder: what the ranks write and
the launcher follows.

Each rank of ``workbench train`` (:mod:`workbench.runtime.rank.worker`) appends its metric records
to ``<run_dir>/live/rank<r>.jsonl`` (:class:`LiveWriter`: at most once every :data:`FLUSH_SECONDS`,
and when the rank ends, a failure included), so a run folder shows how far a run got before
``summary.json`` exists. The first line of each file is ``{"kind": "plan", "rank": r, "steps":
n}`` (the training steps the rank will take; 0 on a master); the others are records as in
``metrics.jsonl``. The launcher's :func:`following` reads what is new every second in a thread:
``workbench train`` copies it into the results store (a run that fails or is killed keeps the
records it made) and shows a progress bar (:class:`ProgressBar`). A file on a shared folder
works the same on a virtual or real cluster's nodes.

No torch, no MPI.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ..telemetry import Observer

#: the live files' folder inside a run directory
LIVE_FOLDER = "live"
#: a rank writes its new records at most this often (and when it ends)
FLUSH_SECONDS = 1.0
#: the launcher looks for new records this often
FOLLOW_SECONDS = 1.0


class LiveWriter(Observer):
    """One rank's live file: ``rank<rank>.jsonl`` in ``folder``, opened (emptied) at once with
    the plan line. :meth:`close` writes what is pending."""

    def __init__(self, folder: str | Path, rank: int, steps: int) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self._file = open(Path(folder) / f"rank{rank}.jsonl", "w")
        self._pending: list[dict] = [{"kind": "plan", "rank": rank, "steps": steps}]
        self._due = 0.0
        self.flush()

    def on_metric(self, record: dict) -> None:
        self._pending.append(record)
        if time.perf_counter() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Write the pending records (whole lines) now."""
        if self._pending:
            self._file.write("".join(json.dumps(r) + "\n" for r in self._pending))
            self._file.flush()
            self._pending.clear()
        self._due = time.perf_counter() + FLUSH_SECONDS

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


class LiveFollower:
    """Reads the complete lines added to a run's live files since the last :meth:`read`.

    ``planned``: each rank's plan (steps it will take), ``done``: each rank's training steps
    recorded so far, ``latest``: each rank's newest training record, ``evaluation``: the newest
    evaluation record."""

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = Path(run_dir) / LIVE_FOLDER
        self._offsets: dict[Path, int] = {}
        self.planned: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self.latest: dict[int, dict] = {}
        self.evaluation: dict | None = None
        self.errors: list[Exception] = []   # consumers :func:`following` dropped

    def read(self) -> list[dict]:
        """The metric records written since the last call (plan lines kept to :attr:`planned`)."""
        records = []
        for path in sorted(self.folder.glob("rank*.jsonl")):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except OSError:  # written by a rank on a node whose folder went away: nothing more
                continue
            whole = data[:data.rfind(b"\n") + 1]   # a line still being written waits for the next read
            self._offsets[path] = self._offsets.get(path, 0) + len(whole)
            for line in whole.splitlines():
                record = json.loads(line)
                if record.get("kind") == "plan":
                    self.planned[record["rank"]] = record["steps"]
                    continue
                records.append(record)
                self._note(record)
        return records

    def _note(self, record: dict) -> None:
        if record.get("kind") == "train":
            rank = record["rank"]
            self.done[rank] = max(self.done.get(rank, 0), record["step"] + 1)
            self.latest[rank] = record
        elif record.get("kind") == "eval":
            self.evaluation = record


@contextmanager
def following(run_dir: str | Path, consumers: list[Callable[[LiveFollower, list[dict]], None]],
              interval: float = FOLLOW_SECONDS) -> Iterator[LiveFollower]:
    """While the block runs, hand each consumer ``(follower, new records)`` every ``interval``
    seconds when there are new records, and once more at the end (what the ranks wrote last).
    A consumer that raises is dropped, said on stderr and its error kept in ``follower.errors``;
    the run goes on."""
    follower, stop, lock = LiveFollower(run_dir), threading.Event(), threading.Lock()
    live = list(consumers)

    def deliver() -> None:
        with lock:
            records = follower.read()
            for consumer in list(live) if records else []:
                try:
                    consumer(follower, records)
                except Exception as exc:  # noqa: BLE001 - a store or terminal problem must not stop the run
                    live.remove(consumer)
                    follower.errors.append(exc)
                    print(f"workbench: the run's live records are no longer followed by {consumer!r} "
                          f"({type(exc).__name__}: {exc}); the run goes on", file=sys.stderr, flush=True)

    def loop() -> None:
        while not stop.wait(interval):
            deliver()

    thread = threading.Thread(target=loop, name="workbench-live", daemon=True)
    thread.start()
    try:
        yield follower
    finally:
        stop.set()
        thread.join()
        deliver()


class ProgressBar:
    """A consumer of :func:`following`: a tqdm bar of the training steps all ranks have taken
    against those they will take, with the ranks' mean latest loss and the newest test accuracy.
    On a terminal it redraws every second; into a file (a Slurm job's output) every 30 s."""

    def __init__(self, description: str, file=None) -> None:
        self.description, self.file = description, file or sys.stderr
        self.bar = None   # drawn with the first records: the plan's total known, the rate from the training

    def __call__(self, follower: LiveFollower, records: list[dict]) -> None:
        if self.bar is None:
            from tqdm import tqdm
            tty = hasattr(self.file, "isatty") and self.file.isatty()
            self.bar = tqdm(total=sum(follower.planned.values()) or None, desc=self.description, unit="step",
                            file=self.file, mininterval=1.0 if tty else 30.0, dynamic_ncols=tty)
        shown = {}
        if follower.latest:
            shown["loss"] = f"{sum(r['loss'] for r in follower.latest.values()) / len(follower.latest):.4f}"
        if follower.evaluation is not None:
            shown["test_acc"] = f"{follower.evaluation['test_accuracy']:.4f}"
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(sum(follower.done.values()) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
