"""A run's status and the one way it changes: the states a :class:`~workbench.runtime.client.run.Run`
goes through, as a table (:data:`TRANSITIONS`), and :class:`RunState`, which refuses any change the
table does not allow. Pure (standard library only)."""
from __future__ import annotations

import threading
import time

#: a run's states and the ones each may go to: a run starts ``running`` and ends once, as
#: ``finished``, ``cancelled`` or ``failed``; an ended run turns ``failed`` only if recording its end
#: failed (the receiver thread raised). ``failed`` is final.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "running": ("finished", "cancelled", "failed"),
    "finished": ("failed",),
    "cancelled": ("failed",),
    "failed": (),
}


class RunStateError(RuntimeError):
    """A change of a run's status that :data:`TRANSITIONS` does not allow (a bug in ``run.py``)."""


class RunState:
    """A run's ``status`` (``running`` at first) and the one way to change it, :meth:`move`, which
    refuses what :data:`TRANSITIONS` does not allow and notes when the run ended (``ended``, unix
    seconds, set once). Thread-safe: the receiver thread and ``cancel()`` may both stop a run."""

    def __init__(self, run_id: str) -> None:
        self.run_id, self._status, self._ended = run_id, "running", None
        self._lock = threading.Lock()

    @property
    def status(self) -> str:
        return self._status

    @property
    def ended(self) -> float | None:
        return self._ended

    def move(self, new: str, *, if_running: bool = False) -> bool:
        """Change the status to ``new``; raise :class:`RunStateError` if that is not allowed. With
        ``if_running``, a run that has ended already is left as it is (False): stopping a run that
        another thread has just stopped is no error."""
        with self._lock:
            if if_running and self._status != "running":
                return False
            allowed = TRANSITIONS.get(self._status, ())
            if new not in allowed:
                raise RunStateError(f"run {self.run_id}: status cannot go from {self._status!r} to {new!r}; "
                                    f"from {self._status!r} it may go to {', '.join(allowed) or 'nothing (final)'}")
            self._status = new
            if self._ended is None:
                self._ended = time.time()
            return True
