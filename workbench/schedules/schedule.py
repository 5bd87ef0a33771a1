"""A collective algorithm as data: a :class:`Schedule` of steps of :class:`Transfer`.

The buffer being all-reduced is split into ``nchunks`` near-equal contiguous chunks
(:func:`chunk_bounds`). A step is a list of transfers that happen together; within a step
every transfer reads the values as they were *before* the step, then all are applied. So a
pairwise exchange is two transfers in one step. After the last step every rank must hold the
element-wise sum of all ranks' buffers; :meth:`Schedule.validate` checks that symbolically.

The MPI executor (:mod:`workbench.comm.executor`) runs any Schedule for real, the
simulator times it on a topology: the algorithm is written once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from ..checks import integer


class Transfer(NamedTuple):
    """One message of one chunk in one step.

    ``reduce=True``: ``dst.chunk += src.chunk``; ``reduce=False``: ``dst.chunk = src.chunk``.
    A NamedTuple (not a dataclass) because schedules for large networks hold millions of them.

    Attributes:
        src (int): the sending rank.
        dst (int): the receiving rank.
        chunk (int): the chunk's index, in ``0 .. nchunks-1`` (:func:`chunk_bounds`).
        reduce (bool): add into the receiver's chunk (True) or overwrite it (False).
    """

    src: int
    dst: int
    chunk: int
    reduce: bool


class ScheduleError(ValueError):
    """A schedule that does not compute an all-reduce; the message names the first violation."""


def chunk_bounds(length: int, nchunks: int) -> list[tuple[int, int]]:
    """Split ``length`` elements into ``nchunks`` contiguous ``(start, stop)`` ranges.

    The first ``length % nchunks`` chunks get one extra element, so sizes differ by at most
    one. Chunks may be empty when ``length < nchunks``.
    """
    if nchunks < 1:
        raise ValueError(f"nchunks must be >= 1, got {nchunks}")
    base, extra = divmod(length, nchunks)
    bounds = []
    start = 0
    for c in range(nchunks):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True, eq=False)
class Schedule:
    """An all-reduce algorithm as a list of lock-step steps.

    Attributes:
        name: the generator's name (``"ring"``, ``"halving_doubling"``, ...).
        nranks: number of ranks the schedule is written for.
        nchunks: the buffer is split into this many chunks (see :func:`chunk_bounds`).
        steps: ``steps[t]`` is the list of transfers of step ``t``.
        params: generator arguments worth showing (e.g. the ring order), for display only.

    Raises:
        ScheduleError: ``nranks`` or ``nchunks`` is not an integer >= 1 (at construction; whether the steps
            compute an all-reduce is :meth:`validate`'s).
    """

    name: str
    nranks: int
    nchunks: int
    steps: tuple[tuple[Transfer, ...], ...]
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        integer("nranks", self.nranks, error=ScheduleError)
        integer("nchunks", self.nchunks, error=ScheduleError)
        # Accept any iterables from callers but store immutable tuples.
        # (Transfers are kept as they are: big MultiTree schedules hold millions of them)
        object.__setattr__(self, "steps", tuple(tuple(t if type(t) is Transfer else Transfer(*t) for t in s)
                                                for s in self.steps))

    @property
    def num_steps(self) -> int:
        """Number of lock-step steps."""
        return len(self.steps)

    @property
    def num_transfers(self) -> int:
        """Total number of chunk transfers over all steps."""
        return sum(len(s) for s in self.steps)

    def chunks_sent_by(self, rank: int) -> int:
        """How many chunk transfers ``rank`` sends over the whole schedule (0 for a rank that sends none).

        Args:
            rank: the rank, in ``0 .. nranks-1``.
        """
        return sum(1 for s in self.steps for t in s if t.src == rank)

    def __repr__(self) -> str:
        return (f"Schedule({self.name!r}, nranks={self.nranks}, nchunks={self.nchunks}, "
                f"steps={self.num_steps}, transfers={self.num_transfers})")

    def validate(self) -> "Schedule":
        """Symbolically execute the schedule; raise :class:`ScheduleError` at the first violation.

        Each (rank, chunk) holds the set of ranks whose contribution it contains, as a bit
        set. A reduce that would add a contribution already present is *double counting*; two
        copies into the same place in one step, or a copy and a reduce, are *conflicting
        writes*; after the last step a missing contribution anywhere is reported with the
        rank, chunk and missing ranks.

        Returns:
            (Schedule): The schedule itself, so calls can be chained.

        Raises:
            ScheduleError: a rank or chunk out of range, a rank sending to itself, conflicting writes,
                double counting (the message names the step and the transfer), or a contribution missing
                after the last step (it names the rank, the chunk and the missing ranks).
        """
        n, k = self.nranks, self.nchunks
        state = [[1 << r] * k for r in range(n)]
        for t_index, step in enumerate(self.steps):
            writes: dict[tuple[int, int], list[Transfer]] = {}
            for tr in step:
                where = f"step {t_index}, {tr}"
                if not (0 <= tr.src < n and 0 <= tr.dst < n):
                    raise ScheduleError(f"{where}: rank out of range 0..{n - 1}")
                if not 0 <= tr.chunk < k:
                    raise ScheduleError(f"{where}: chunk out of range 0..{k - 1}")
                if tr.src == tr.dst:
                    raise ScheduleError(f"{where}: a rank cannot send to itself")
                writes.setdefault((tr.dst, tr.chunk), []).append(tr)
            updates = []
            for (dst, chunk), trs in writes.items():
                copies = [tr for tr in trs if not tr.reduce]
                if copies and len(trs) > 1:
                    raise ScheduleError(
                        f"step {t_index}: conflicting writes to rank {dst} chunk {chunk}: {trs}")
                if copies:
                    updates.append((dst, chunk, state[copies[0].src][chunk]))
                    continue
                value = state[dst][chunk]
                for tr in trs:
                    incoming = state[tr.src][chunk]
                    overlap = value & incoming
                    if overlap:
                        raise ScheduleError(
                            f"step {t_index}, {tr}: double counting of rank(s) "
                            f"{_ranks_of(overlap)} in rank {dst} chunk {chunk}")
                    value |= incoming
                updates.append((dst, chunk, value))
            for dst, chunk, value in updates:  # applied after all reads: pre-step semantics
                state[dst][chunk] = value
        full = (1 << n) - 1
        for r in range(n):
            for c in range(k):
                if state[r][c] != full:
                    missing = _ranks_of(full & ~state[r][c])
                    raise ScheduleError(
                        f"after the last step rank {r} chunk {c} lacks the contribution of "
                        f"rank(s) {missing}")
        return self


def _ranks_of(bits: int) -> list[int]:
    out, r = [], 0
    while bits:
        if bits & 1:
            out.append(r)
        bits >>= 1
        r += 1
    return out


def make_schedule(name: str, nranks: int, nchunks: int, steps: Iterable[Iterable[Transfer]],
                  **params) -> Schedule:
    """Build a Schedule, dropping empty steps (generators may emit them for tiny cases)."""
    return Schedule(name, nranks, nchunks, tuple(tuple(s) for s in steps if s), params)
