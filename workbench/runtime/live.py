"""The live stream from the ranks to the notebook, and what runs on each engine.

Every rank pushes its metric records and spans over a ZeroMQ PUSH socket to a PULL socket that
the notebook's :class:`~workbench.runtime.cluster.Run` binds. Why a side channel and not
``ipyparallel.datapub.publish_data``: that keeps only the latest value per key, so per-step
metrics would be lost or would have to be re-sent cumulatively. ZeroMQ queues every message.

Records are batched on the rank and sent at most every ``FLUSH_SECONDS`` (a send costs
~10-20 us; one per step would show in the step time of a small model), so a record reaches the
notebook within ``FLUSH_SECONDS`` plus one step.

Only the run's own ranks can feed the stream: every run has a fresh 256-bit secret, handed to
the ranks with the run's configuration over ipyparallel's own (authenticated) connection, and
every message travels as two frames ``[HMAC-SHA256(secret, body), body]``. The notebook checks
the MAC in constant time before it parses anything; a message that fails (another process
connecting to the port, a truncated or oversized frame) is dropped and counted, never acted on.
The secret itself never crosses the wire.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
import traceback
from pathlib import Path

import zmq

from .telemetry import Observer

FLUSH_SECONDS = 0.05
#: the largest message the notebook accepts (bytes); larger ones are dropped by ZeroMQ
MAX_MESSAGE_BYTES = 64 << 20


def new_secret() -> str:
    """A fresh per-run key (hex) for :func:`sign` / :func:`verify`."""
    return secrets.token_hex(32)


def sign(secret: str, body: bytes) -> bytes:
    """The message authentication code of ``body`` under ``secret``."""
    return hmac.new(bytes.fromhex(secret), body, hashlib.sha256).digest()


def verify(secret: str, frames: list[bytes], run_id: str) -> dict | None:
    """The message in ``frames`` if it is signed with ``secret`` and belongs to ``run_id``, else None."""
    if len(frames) != 2:
        return None
    mac, body = frames
    if not hmac.compare_digest(mac, sign(secret, body)):
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("run_id") != run_id:
        return None
    return message


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

    from ..config import RunConfig
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
