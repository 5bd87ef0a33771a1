"""The live stream from the ranks to the notebook, and what runs on each engine.

Every rank pushes its metric records and spans over a ZeroMQ PUSH socket to a PULL socket that
the notebook's :class:`~workbench.runtime.cluster.Run` binds. Why a side channel and not
``ipyparallel.datapub.publish_data``: that keeps only the latest value per key, so per-step
metrics would be lost or would have to be re-sent cumulatively. ZeroMQ queues every message.

Records are batched on the rank and sent at most every ``FLUSH_SECONDS`` (a send costs
~10-20 us; one per step would show in the step time of a small model), so a record reaches the
notebook within ``FLUSH_SECONDS`` plus one step.
"""
from __future__ import annotations

import json
import threading
import time
import traceback
from pathlib import Path

import zmq

from .telemetry import Observer

FLUSH_SECONDS = 0.05


class LiveSink(Observer):
    """Rank side: batch spans and metric records and push them to ``address``."""

    def __init__(self, address: str, rank: int, run_id: str) -> None:
        self.rank, self.run_id = rank, run_id
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 5000)  # close() waits this long for queued batches
        self._socket.connect(address)
        self._spans: list[dict] = []
        self._metrics: list[dict] = []
        self._next_flush = 0.0
        self._lock = threading.Lock()  # hogwild server threads record at once; sockets are not thread-safe

    def on_span(self, event: dict) -> None:
        self._spans.append(event)
        self._maybe_flush()

    def on_metric(self, record: dict) -> None:
        self._metrics.append(record)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if time.perf_counter() >= self._next_flush:
            self.flush()

    def flush(self) -> None:
        """Send what is buffered now (one message)."""
        if not self._lock.acquire(blocking=False):
            return  # another thread is sending; our records go with the next batch
        try:
            self._next_flush = time.perf_counter() + FLUSH_SECONDS
            spans, self._spans = self._spans, []
            metrics, self._metrics = self._metrics, []
            if spans or metrics:
                self._send({"metrics": metrics, "spans": spans})
        finally:
            self._lock.release()

    def _send(self, message: dict) -> None:
        message.update(rank=self.rank, run_id=self.run_id, sent=time.time())
        self._socket.send(json.dumps(message).encode())

    def error(self, text: str) -> None:
        """Tell the notebook this rank failed, with its traceback (before anything else hangs)."""
        with self._lock:
            self._send({"error": text})

    def close(self, status: str = "done") -> None:
        self.flush()
        with self._lock:
            self._send({"end": status})
            self._socket.close()


def engine_train(config: dict, run_dir: str, address: str, run_id: str) -> dict | None:
    """Runs on every engine (an MPI rank): train ``config`` on the first ``ranks`` ranks.

    All engines take part in the ``Split``; those beyond ``ranks`` return at once. An error is
    pushed to the notebook with this rank's traceback before it propagates, so the notebook can
    name the rank even while the other ranks are stuck in a collective.
    """
    import os

    from mpi4py import MPI

    from ..config import RunConfig
    from .worker import run_rank

    os.environ["OMP_NUM_THREADS"] = "1"
    cfg = RunConfig.from_dict(config)
    world = MPI.COMM_WORLD
    comm = world.Split(0 if world.Get_rank() < cfg.ranks else MPI.UNDEFINED, world.Get_rank())
    if comm == MPI.COMM_NULL:
        return None
    sink = LiveSink(address, comm.Get_rank(), run_id)
    try:
        summary = run_rank(cfg, comm, Path(run_dir), observers=[sink])
    except BaseException as exc:
        sink.error(f"rank {comm.Get_rank()} failed: {exc!r}\n" + traceback.format_exc())
        sink.close("failed")
        raise
    sink.close("finished")
    comm.Free()
    return summary
