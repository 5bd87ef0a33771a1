"""What runs on each engine for a notebook run: train, and push every record to the notebook.

The sink batches records on the rank and sends them at most every ``FLUSH_SECONDS`` (a send
costs ~10-20 us; one per step would show in the step time of a small model), so a record
reaches the notebook within ``FLUSH_SECONDS`` plus one step. Messages are signed
(:mod:`workbench.runtime.stream`).
"""
from __future__ import annotations

import json
import threading
import time
import traceback
from pathlib import Path

import zmq

from ...telemetry import Observer
from ..stream import sign

FLUSH_SECONDS = 0.05


class LiveSink(Observer):
    """Rank side: batch spans and metric records and push them to ``address``."""

    def __init__(self, address: str, rank: int, run_id: str, secret: str) -> None:
        self.rank, self.run_id, self._secret = rank, run_id, secret
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 5000)  # close() waits this long for queued batches
        self._socket.connect(address)
        self._spans: list[dict] = []
        self._metrics: list[dict] = []
        self._next_flush = 0.0
        self._lock = threading.Lock()  # hogwild server threads record at once; sockets are not thread-safe
        # appends and the flusher's swap of the buffers: without it a record appended to a buffer
        # the flusher has just taken (and serialised) would be lost
        self._buffer_lock = threading.Lock()

    def on_span(self, event: dict) -> None:
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
        """Send what is buffered now (one message)."""
        if not self._lock.acquire(blocking=False):
            return  # another thread is sending; our records go with the next batch
        try:
            self._next_flush = time.perf_counter() + FLUSH_SECONDS
            with self._buffer_lock:
                spans, self._spans = self._spans, []
                metrics, self._metrics = self._metrics, []
            if spans or metrics:
                self._send({"metrics": metrics, "spans": spans})
        finally:
            self._lock.release()

    def _send(self, message: dict) -> None:
        message.update(rank=self.rank, run_id=self.run_id, sent=time.time())
        body = json.dumps(message).encode()
        self._socket.send_multipart([sign(self._secret, body), body])

    def error(self, text: str) -> None:
        """Tell the notebook this rank failed, with its traceback (before anything else hangs)."""
        with self._lock:
            self._send({"error": text})

    def close(self, status: str = "done") -> None:
        self.flush()
        with self._lock:
            self._send({"end": status})
            self._socket.close()


def engine_train(config: dict, run_dir: str, address: str, run_id: str, secret: str) -> dict | None:
    """Runs on every engine (an MPI rank): train ``config`` on the first ``ranks`` ranks.

    All engines take part in the ``Split``; those beyond ``ranks`` return at once. An error is
    pushed to the notebook with this rank's traceback before it propagates, so the notebook can
    name the rank even while the other ranks are stuck in a collective. The run's communicator
    is freed however the run ends, and with it every state cached on it (the executor's
    duplicate, the tuning table): nothing of this run leaks into the next.
    """
    import os

    from mpi4py import MPI

    from ...config import RunConfig
    from .worker import run_rank

    os.environ["OMP_NUM_THREADS"] = "1"
    cfg = RunConfig.from_dict(config)
    world = MPI.COMM_WORLD
    comm = world.Split(0 if world.Get_rank() < cfg.ranks else MPI.UNDEFINED, world.Get_rank())
    if comm == MPI.COMM_NULL:
        return None
    try:
        sink = LiveSink(address, comm.Get_rank(), run_id, secret)
        try:
            summary = run_rank(cfg, comm, Path(run_dir), observers=[sink])
        except BaseException as exc:
            sink.error(f"rank {comm.Get_rank()} failed: {exc!r}\n" + traceback.format_exc())
            sink.close("failed")
            raise
        sink.close("finished")
        return summary
    finally:
        try:
            comm.Free()
        except Exception:  # noqa: BLE001 - never mask the run's own error
            pass
