"""What runs on each engine for a notebook run: train, with the run's live channel a signed ZeroMQ
stream to the notebook (:class:`StreamChannel`, the notebook's transport of :mod:`workbench.runtime.live`).

The channel batches records on the rank and sends them at most every 50 ms (a send costs ~10-20 us;
one per step would show in the step time of a small model), so a record reaches the notebook within
50 ms plus one step. Messages are signed (:mod:`workbench.runtime.stream`).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import zmq

from ..live import LiveChannel
from ..stream import sign


class StreamChannel(LiveChannel):
    """A rank's live channel over ZeroMQ: each message pushed to ``address``, signed with ``secret`` and
    marked with ``run_id`` and the time it was sent."""

    def __init__(self, address: str, rank: int, run_id: str, secret: str) -> None:
        super().__init__(rank)
        self.run_id, self._secret = run_id, secret
        self._socket = zmq.Context.instance().socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 5000)  # close() waits this long for queued batches
        self._socket.connect(address)

    def _send(self, message: dict) -> None:
        message.update(run_id=self.run_id, sent=time.time())
        body = json.dumps(message).encode()
        self._socket.send_multipart([sign(self._secret, body), body])

    def _transport_close(self) -> None:
        self._socket.close()


def engine_train(config: dict, run_dir: str, address: str, run_id: str, secret: str,
                 resume: str | None = None) -> dict | None:
    """Runs on every engine (an MPI rank): train ``config`` on the first ``ranks`` ranks (from the newest
    checkpoint in ``resume``, a run folder, when given).

    All engines take part in the ``Split``; those beyond ``ranks`` return at once. A rank that raises
    tells the notebook with its traceback before the error propagates (:func:`~.worker.run_rank`), so the
    notebook can name the rank even while the other ranks are stuck in a collective. The run's
    communicator is freed however the run ends, and with it every state cached on it (the executor's
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
        return run_rank(cfg, comm, Path(run_dir), Path(resume) if resume else None,
                        live=StreamChannel(address, comm.Get_rank(), run_id, secret))
    finally:
        try:
            comm.Free()
        except Exception:  # noqa: BLE001 - never mask the run's own error
            pass
