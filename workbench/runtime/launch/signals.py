"""Signals and a running MPI job: SIGINT, SIGTERM and SIGHUP stop the job, never orphan it.

:class:`RunInterrupted` is what the launcher raises once the job has ended after such a signal;
the helpers install, defer or turn signals into it for the duration of a block.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Sequence


class RunInterrupted(KeyboardInterrupt):
    """This process got SIGINT, SIGTERM or SIGHUP while an MPI job ran; the job has ended.

    ``signum``: the first signal; ``exit_code``: the conventional ``128 + signum``.
    A :class:`KeyboardInterrupt`, so ``except Exception`` does not swallow it.
    """

    def __init__(self, signum: int, detail: str = "") -> None:
        self.signum = int(signum)
        self.detail = detail
        self.hosts: dict[int, str] = {}  # rank -> the host it ran on, when the launcher knew
        super().__init__(f"interrupted by {signal_name(self.signum)}" + (f"; {detail}" if detail else ""))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return str(self.args[0])


#: the signals that stop a job (and the command line that launched it)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextmanager
def handling_signals(handler: Callable[[int, object], object], signals: Sequence[int] = STOP_SIGNALS):
    """Install ``handler`` for ``signals`` for the duration of the block, then put the previous
    handlers back. Outside the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    try:
        for signum in signals:
            previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


@contextmanager
def deferred_signals():
    """SIGINT, SIGTERM and SIGHUP wait until the block is done (a store write is not cut in
    half); then the first of them is raised as :class:`RunInterrupted`."""
    got: list[int] = []
    with handling_signals(lambda signum, frame: got.append(signum)):
        yield
    if got:
        raise RunInterrupted(got[0])


def signals_ignored():
    """SIGINT, SIGTERM and SIGHUP ignored for the block (recording a run that is stopping already: a
    second signal must not leave its row ``running``)."""
    return handling_signals(signal.SIG_IGN)


def raise_interrupted(signum: int, frame=None) -> None:
    """A signal handler: SIGTERM and SIGHUP end the command like Ctrl-C does, as an exception."""
    raise RunInterrupted(signum)
