"""The notebook's ranks as a :class:`~workbench.runtime.launch.launcher.Launcher`: the engines of a
:class:`~.cluster.Cluster` (ipyparallel engines that are MPI ranks, each under the rank guard), which
run one training run (:func:`~workbench.runtime.rank.sink.engine_train`) at a time. Starting a run is
one ``apply_async`` on every engine; stopping it kills the engines (the cluster starts new ones for the
next run); the guards' records are the cluster's (:meth:`~.cluster.Cluster.exits`).

No MPI in this process: the engines are the ranks.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from ..launch.launcher import Launcher
from ..rank.sink import engine_train


class Engines(Launcher):
    """One run's ranks on ``cluster``'s engines: ``engine_train(config, run_dir, address, run_id, secret,
    resume)`` on every engine (``address``: the run's signed live stream; ``resume``: a run folder whose newest
    checkpoint the ranks go on from, a restart's)."""

    name = "engines"

    def __init__(self, cluster, config: dict, run_dir: str, address: str, run_id: str, secret: bytes,
                 resume: str | None = None) -> None:
        self.cluster = cluster
        self._call = (config, run_dir, address, run_id, secret, resume)
        self._async = None

    @property
    def abort_kills_all(self) -> bool:
        """Engines in one Slurm job: an abort makes srun SIGKILL every task at once."""
        return self.cluster.engines == "slurm"

    @property
    def flavour(self):
        """The MPI library of ``mpiexec`` engines (its ways: :mod:`workbench.mpilib`); None for Slurm's."""
        if self.cluster.engines != "mpi":
            return None
        from ...mpilib import flavour
        return flavour()

    def start(self) -> None:
        self._async = self.cluster.view().apply_async(engine_train, *self._call)

    def ended(self) -> bool:
        """Every engine has returned from the run (cleanly or with an error)."""
        return self._async.ready()

    def wait(self, timeout: float, on_interrupt: Callable[[], object] | None = None, grace: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while not self.ended():
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(0.05)
        return "exited"

    def signal(self, signum: int) -> None:
        """``signum`` to the engines of this host (those on other nodes are reached by :meth:`stop` only)."""
        for pid in self.cluster.local_ranks().values():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, immediate: bool = True) -> None:
        """Kill the engines (or cancel their Slurm job); the cluster replaces them before its next run."""
        self.cluster.kill_engines()

    def records(self) -> tuple[dict[int, dict], list[dict]]:
        """No start records here (the cluster maps ranks to pids and hosts); the ends, first first, of
        the engines that were not ended by their launcher stopping the job."""
        return {}, [e for e in self.cluster.exits() if not e.get("launcher_stopped")]

    def dead(self) -> list[int]:
        """Ranks whose engine process is gone (this host's)."""
        return self.cluster.dead_ranks()

    def error(self) -> tuple[int | None, str, bool]:
        """The engines' exception as (rank, text, an engine died), or (None, "", False): an error before
        the live stream opened, or an engine that died unrecorded."""
        try:
            self._async.get(timeout=0)
        except Exception as exc:  # noqa: BLE001 - ipyparallel's CompositeError / EngineError
            errors = list(getattr(exc, "elist", ())) or [(type(exc).__name__, str(exc), "", {})]
            if any(name == "EngineError" for name, *_ in errors):
                return None, ("an engine died (killed, out of memory, or crashed outside Python); MPI "
                              "stopped the other ranks.\n" + "\n".join(str(e[1]) for e in errors)), True
            name, value, text, info = errors[0]
            rank = self.cluster.ranks.get((info or {}).get("engine_id"))
            return rank, f"rank {rank} failed: {name}: {value}\n{text}", False
        return None, "", False
