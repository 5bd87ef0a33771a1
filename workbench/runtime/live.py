"""A run's live channel: what each rank says while it runs, and how whoever holds the run reads it.

One channel, one message shape, two transports. Every rank of every run, notebook or batch, has a
:class:`LiveChannel` among its telemetry observers (:func:`workbench.runtime.rank.worker.run_rank`).
It batches what the rank records and sends **messages**, dicts with the rank and any of:

- ``plan``: the training steps the rank will take (0 on a master), sent once, first;
- ``metrics``: metric records (as in ``metrics.jsonl``); ``spans``: telemetry spans, where the
  transport carries them (:attr:`LiveChannel.carries_spans`);
- ``error``: the rank's traceback, sent the moment it raises (before anything else can hang);
- ``end``: how the rank ended (``finished``, ``failed``), its last message.

Whoever holds the run (a :class:`~workbench.runtime.client.handle.RunHandle`) reads them in one place,
:meth:`~workbench.runtime.client.handle.RunHandle.receive`, whichever transport brought them. The
transport goes with the launcher, as ipyparallel's launchers carry their own way of starting engines:

- **files** (:class:`LiveFile`, read by :class:`LiveFiles`; ``workbench train``, ``compare``, the
  benchmarks): each rank appends its messages to ``<run_dir>/live/rank<r>.jsonl``, one JSON line each,
  at most every :data:`FLUSH_SECONDS`; the launcher reads what is new every :data:`FOLLOW_SECONDS`
  (:func:`following`). No socket: a batch job's nodes need not reach the login node, the records
  survive a killed ``workbench train``, and on a shared file system it works the same on any node.
- **a signed ZeroMQ stream** (:class:`~workbench.runtime.rank.sink.StreamChannel`; the notebook's
  engines): a message every 50 ms to the kernel, which the dashboards redraw from, spans included
  (:mod:`workbench.runtime.stream` says how it is signed).

No torch, no MPI.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..telemetry import Observer

#: the live files' folder inside a run directory
LIVE_FOLDER = "live"
#: a rank writes its new records to its live file at most this often (and when it ends)
FLUSH_SECONDS = 1.0
#: the launcher looks for new records this often
FOLLOW_SECONDS = 1.0


# -- the rank's side -------------------------------------------------------------------------------

class LiveChannel(Observer):
    """A rank's live channel (see the module's text): records batched and sent as messages at most every
    :attr:`flush_seconds`; :meth:`plan` first, :meth:`error` at once, :meth:`close` last. Safe to record
    from several threads (a hogwild master's). A transport writes :meth:`_send`."""

    #: whether spans travel too (metric records always do)
    carries_spans = True
    #: the longest a record waits in the rank before it is sent
    flush_seconds = 0.05

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._spans: list[dict] = []
        self._metrics: list[dict] = []
        self._next_flush = 0.0
        self._closed = False
        self._send_lock = threading.Lock()  # one sender at a time: sockets and files are not thread-safe
        # appends and the flusher's swap of the buffers: without it a record appended to a buffer
        # the flusher has just taken (and serialised) would be lost
        self._buffer_lock = threading.Lock()

    def _send(self, message: dict) -> None:
        raise NotImplementedError

    def _transport_close(self) -> None:
        """Release the transport (after the last message)."""

    def on_span(self, event: dict) -> None:
        if self.carries_spans:
            with self._buffer_lock:
                self._spans.append(event)
            self._maybe_flush()

    def on_metric(self, record: dict) -> None:
        with self._buffer_lock:
            self._metrics.append(record)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if time.perf_counter() >= self._next_flush:
            self.flush()

    def flush(self) -> None:
        """Send what is buffered now (one message); another thread sending already takes it next time."""
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            self._next_flush = time.perf_counter() + self.flush_seconds
            with self._buffer_lock:
                spans, self._spans = self._spans, []
                metrics, self._metrics = self._metrics, []
            if (spans or metrics) and not self._closed:
                self._send({"rank": self.rank, "metrics": metrics, **({"spans": spans} if spans else {})})
        finally:
            self._send_lock.release()

    def _say(self, **message) -> None:
        with self._send_lock:
            if not self._closed:
                self._send({"rank": self.rank, **message})

    def plan(self, steps: int) -> None:
        """The training steps this rank will take (0 on a master): the first message."""
        self._say(plan=steps)

    def error(self, text: str) -> None:
        """This rank failed, with its traceback: sent at once, with the records it made before."""
        self.flush()
        self._say(error=text)

    def close(self, status: str = "finished") -> None:
        """The last message: what is pending, then the end. Once."""
        if self._closed:
            return
        self.flush()
        self._say(end=status)
        with self._send_lock:
            self._closed = True
            self._transport_close()


class LiveFile(LiveChannel):
    """The file transport: ``rank<rank>.jsonl`` in ``folder``, opened (emptied) at once; a message a line."""

    carries_spans = False  # nobody draws a batch run's timeline while it runs: trace.json has them at the end

    def __init__(self, folder: str | Path, rank: int) -> None:
        super().__init__(rank)
        Path(folder).mkdir(parents=True, exist_ok=True)
        self._file = open(Path(folder) / f"rank{rank}.jsonl", "w")

    @property
    def flush_seconds(self) -> float:  # read at each flush: a test may change FLUSH_SECONDS
        return FLUSH_SECONDS

    def _send(self, message: dict) -> None:
        self._file.write(json.dumps(message) + "\n")
        self._file.flush()

    def _transport_close(self) -> None:
        self._file.close()


# -- whoever holds the run ---------------------------------------------------------------------------

def records_in(messages: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """The metric records and the spans that ``messages`` carry, in order."""
    records, spans = [], []
    for message in messages:
        records.extend(message.get("metrics", ()))
        spans.extend(message.get("spans", ()))
    return records, spans


class Progress:
    """How far a run got, from its messages (:meth:`note`): ``planned`` (each rank's steps to take),
    ``done`` (each rank's training steps recorded so far), ``latest`` (each rank's newest training
    record), ``evaluation`` (the newest evaluation record)."""

    def __init__(self) -> None:
        self.planned: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self.latest: dict[int, dict] = {}
        self.evaluation: dict | None = None

    def note(self, messages: Iterable[dict]) -> None:
        for message in messages:
            if "plan" in message:
                self.planned[message["rank"]] = message["plan"]
            for record in message.get("metrics", ()):
                if record.get("kind") == "train":
                    rank = record["rank"]
                    self.done[rank] = max(self.done.get(rank, 0), record["step"] + 1)
                    self.latest[rank] = record
                elif record.get("kind") == "eval":
                    self.evaluation = record


class LiveFiles:
    """The file transport's reader: the complete lines (messages) added to a run's live files since the
    last :meth:`read`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = Path(run_dir) / LIVE_FOLDER
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[dict]:
        messages = []
        for path in sorted(self.folder.glob("rank*.jsonl")):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except OSError:  # written by a rank on a node whose folder went away: nothing more
                continue
            whole = data[:data.rfind(b"\n") + 1]   # a line still being written waits for the next read
            self._offsets[path] = self._offsets.get(path, 0) + len(whole)
            messages.extend(json.loads(line) for line in whole.splitlines())
        return messages


@contextmanager
def following(run_dir: str | Path, consumers: list[Callable[[list[dict]], None]],
              interval: float = FOLLOW_SECONDS) -> Iterator[list[Exception]]:
    """While the block runs, hand each consumer the new messages of the run's live files every ``interval``
    seconds when there are any, and once more at the end (what the ranks wrote last). A consumer that
    raises is dropped, said on stderr and its error kept in the list the block gets; the run goes on."""
    reader, stop, lock, errors = LiveFiles(run_dir), threading.Event(), threading.Lock(), []
    live = list(consumers)

    def deliver() -> None:
        with lock:
            messages = reader.read()
            for consumer in list(live) if messages else []:
                try:
                    consumer(messages)
                except Exception as exc:  # noqa: BLE001 - a store or terminal problem must not stop the run
                    live.remove(consumer)
                    errors.append(exc)
                    print(f"workbench: the run's live records are no longer followed by {consumer!r} "
                          f"({type(exc).__name__}: {exc}); the run goes on", file=sys.stderr, flush=True)

    def loop() -> None:
        while not stop.wait(interval):
            deliver()

    thread = threading.Thread(target=loop, name="workbench-live", daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join()
        deliver()


class ProgressBar:
    """A consumer of a run's messages: a tqdm bar of the training steps all ranks have taken against those
    they will take, with the ranks' mean latest loss and the newest test accuracy. On a terminal it
    redraws every second; into a file (a Slurm job's output) every 30 s."""

    def __init__(self, description: str, file=None) -> None:
        self.description, self.file = description, file or sys.stderr
        self.progress = Progress()
        self.bar = None   # drawn with the first records: the plan's total known, the rate from the training

    def __call__(self, messages: list[dict]) -> None:
        progress = self.progress
        progress.note(messages)
        if self.bar is None:
            from tqdm import tqdm
            tty = hasattr(self.file, "isatty") and self.file.isatty()
            self.bar = tqdm(total=sum(progress.planned.values()) or None, desc=self.description, unit="step",
                            file=self.file, mininterval=1.0 if tty else 30.0, dynamic_ncols=tty)
        shown = {}
        if progress.latest:
            shown["loss"] = f"{sum(r['loss'] for r in progress.latest.values()) / len(progress.latest):.4f}"
        if progress.evaluation is not None:
            shown["test_acc"] = f"{progress.evaluation['test_accuracy']:.4f}"
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(sum(progress.done.values()) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
