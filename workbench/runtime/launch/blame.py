"""Which rank failed, and how: the evidence after an MPI job ends non-zero.

Three sources, best first: the rank guards' records (:mod:`.rankguard`: each rank's pid, host and
how its process ended, signal or exit code), each rank's own output (a Python traceback, MPICH's
``Abort(code) ... (rank R ...)`` line) and hydra's own report of a bad termination. The rank
whose process ended first is the one named; the others were stopped after it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...mpilib import Mpich
from .signals import signal_name


#: the first words of a rank's exit when the launcher did not start one MPI job of the run's size
#: (``workbench.runtime.rank.worker``): srun without a PMI the MPI library uses, a foreign mpiexec
NOT_ONE_JOB = "workbench: not one MPI job"


class MPILaunchError(RuntimeError):
    """mpiexec failed, a rank raised, or the job ran past its timeout.

    Attributes: ``failed_ranks`` (the rank whose process ended first, when known: killed by a
    signal, exited, or raised; else the ranks that printed a traceback), ``output`` (all output).
    """

    def __init__(self, message: str, failed_ranks: list[int], output: str) -> None:
        super().__init__(message)
        self.failed_ranks = failed_ranks
        self.output = output


@dataclass
class MPIResult:
    """A finished job: exit code, mpiexec's own output and each rank's output."""

    returncode: int
    output: str  # everything, ranks' outputs each under a "--- rank R ---" header
    ranks: dict[int, str]
    #: the end records of ranks the job went on without (``run_mpi(survive=...)``)
    survived: list = field(default_factory=list)

    def lines_of(self, rank: int) -> list[str]:
        """Output lines of one rank."""
        return self.ranks.get(rank, "").splitlines()


_TAG = re.compile(r"^\[(?:1,)?(\d+)\](?:<std(?:out|err)>)?:?\s?(.*)$")
_SRUN_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")  # srun --label
_MPICH_ABORT = re.compile(r"Abort\((\d+)\) on node \d+ \(rank (\d+) in comm")  # code, rank


def collect_output(launcher_output: str, output_dir: Path, nranks: int, labels: bool = False) -> MPIResult:
    """Each rank's output: from the per-rank files in ``output_dir`` (the rank guards' or hydra's), Open MPI's
    ``--tag-output`` lines, or (``labels``) srun's ``--label`` lines."""
    ranks: dict[int, list[str]] = {}
    rest = []
    tag = _SRUN_LABEL if labels else _TAG
    for line in launcher_output.splitlines():  # Open MPI --tag-output / srun --label lines
        m = tag.match(line)
        if m:
            ranks.setdefault(int(m.group(1)), []).append(m.group(2))
        else:
            rest.append(line)
    for r in range(nranks):  # hydra per-rank files
        for suffix in ("out", "err"):
            path = output_dir / f"rank{r}.{suffix}"
            if path.exists():
                ranks.setdefault(r, []).extend(path.read_text(errors="replace").splitlines())
    texts = {r: "\n".join(lines) for r, lines in sorted(ranks.items())}
    combined = "\n".join(rest + [f"--- rank {r} ---\n{t}" for r, t in texts.items()])
    return MPIResult(0, combined, texts)


def failed_ranks(result: MPIResult) -> list[int]:
    """Ranks that printed a Python traceback or that MPICH reports as aborting."""
    return [r for r, text in result.ranks.items()
            if "Traceback (most recent call last)" in text or _MPICH_ABORT.search(text)]


def who_is(rank, host: str | None, pid: int | None) -> str:
    """``rank 3 on node vc-2 (pid 4242)``: how every error names a rank (the node, then the pid)."""
    return f"rank {rank}" + (f" on node {host}" if host else "") + (f" (pid {pid})" if pid else "")


def describe_end(record: dict) -> str:
    """``was killed by signal 9 (SIGKILL)`` or ``exited with code 3`` for a rank's end record, or
    ``was ended by its guard: the launcher's process (pid 17) that started it died``."""
    if record.get("launcher_died"):
        return f"was ended by its guard: the launcher's process (pid {record['launcher_died']}) that started it died"
    if record.get("launcher_stopped"):
        return f"was killed by its guard as its launcher (pid {record['launcher_stopped']}) ended the job"
    if record.get("signal"):
        return f"was killed by signal {record['signal']} ({signal_name(record['signal'])})"
    if record.get("srun_said"):
        return f"ended: srun reported {record['srun_said']!r}"
    return f"exited with code {record.get('exit_code')}"


def rank_records(status_dir: Path) -> tuple[dict[int, dict], list[dict]]:
    """The guards' records: each rank's start (pid, host) and how each rank ended, first first; a
    rank whose guard noted its launcher's death (``.orphaned``) but recorded no end has that note
    among the ends (``launcher_died``, no exit code or signal)."""
    starts, ends, orphaned = {}, [], {}
    for path in status_dir.glob("rank*.*"):
        if path.suffix not in (".start", ".status", ".orphaned"):
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if path.suffix == ".start":
            starts[record["rank"]] = record
        elif path.suffix == ".orphaned":
            orphaned[record["rank"]] = record
        else:
            ends.append(record)
    ended = {e.get("rank") for e in ends}
    ends += [note for rank, note in orphaned.items() if rank not in ended]
    return starts, sorted(ends, key=lambda r: r.get("time", 0))


_SRUN_NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")
_HYDRA_BAD = re.compile(r"PID (\d+) RUNNING AT (\S+)\s*\n=\s*EXIT CODE: (\d+)")
_SRUN_BAD = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (?:Exited with exit code (\d+)|(.+))$", re.M)
_HYDRA_SIGNAL = re.compile(r"KILLED BY SIGNAL: (\d+)|\(signal (\d+)\)")


def first_cause(ends: list[dict], abort_kills_all: bool = False, aborted: set[int] = frozenset(),
                launcher_signals: frozenset[int] = frozenset()) -> dict | None:
    """Of the guards' end records (first first, :func:`rank_records`), the rank whose end caused the
    others': a rank ended by its guard (its launcher died, or ended the job) is a consequence; a rank
    killed by a signal comes before one that exited or that called MPI_Abort (``aborted``: however its
    process ended after that, a crash in the abort included), which MPICH does when it sees a peer's
    link break, and which may be recorded first (each guard records when it saw its rank end).
    ``abort_kills_all``: the launcher SIGKILLs every task at once on MPI_Abort (srun), so a signal says
    nothing there and the first end is taken. ``launcher_signals``: the signals the launcher sends every
    other rank itself when one ends (Open MPI's SIGTERM: :attr:`~workbench.mpilib.MPIFlavour.stop_signals`): a rank
    ended by one is a consequence while another rank ended otherwise. None when no rank ended badly by itself."""
    causes = [e for e in ends if ended_badly(e)]
    if launcher_signals:
        own = [e for e in causes if e.get("signal") not in launcher_signals]
        causes = own or causes
    killed = [] if abort_kills_all else [e for e in causes if e.get("signal") and e.get("rank") not in aborted]
    return (killed or causes or [None])[0]


def _first_death(result: MPIResult, starts: dict[int, dict], ends: list[dict],
                 abort_kills_all: bool = False, aborted: set[int] = frozenset(),
                 launcher_signals: frozenset[int] = frozenset()) -> dict | None:
    """The record of the rank that ended badly first: from the guards (:func:`first_cause`), else
    (ranks on hosts that could not write to this host's folder) from hydra's report when its PID is a
    known rank."""
    first = first_cause(ends, abort_kills_all, aborted, launcher_signals)
    if first is not None:
        return first
    m = _SRUN_BAD.search(result.output)  # srun's report: its first line names the first task that ended badly
    if m and int(m.group(2)) not in {e.get("rank") for e in ends}:
        host, rank = m.group(1), int(m.group(2))
        record = {"rank": rank, "pid": starts.get(rank, {}).get("pid"), "host": host}
        if m.group(3) is not None:
            record["exit_code"] = int(m.group(3))
        else:
            said = m.group(4).strip()
            record["signal"] = _signal_number(said)
            record["srun_said"] = said
        return record
    m = _HYDRA_BAD.search(result.output)
    if not m:
        return None
    pid, host, code = int(m.group(1)), m.group(2), int(m.group(3))
    rank = next((r for r, s in starts.items() if pid in (s.get("pid"), s.get("guard_pid"))), None)
    if rank is None:
        return None
    sig = _HYDRA_SIGNAL.search(result.output[m.start():])
    record = {"rank": rank, "pid": pid, "host": host}
    if sig:
        record["signal"] = int(sig.group(1) or sig.group(2))
    else:
        record["exit_code"] = code
    return record


def ended_badly(record: dict) -> bool:
    """A guard's end record of a rank that ended by a signal or a non-zero exit by itself (not ended by
    its guard because the launcher died or ended the job)."""
    return bool(record.get("signal") or record.get("exit_code")) and not _consequence(record)


def _consequence(record: dict) -> bool:
    """The guard ended its rank because the launcher's process died or ended the job (:mod:`.rankguard`)."""
    return bool(record.get("launcher_died") or record.get("launcher_stopped"))


def _signal_number(description: str) -> int | None:
    """The signal whose ``strsignal`` is ``description`` (srun writes "Killed", "Terminated")."""
    import signal
    for sig in signal.Signals:
        if signal.strsignal(sig) == description:
            return int(sig)
    return None


def failure(nranks: int, result: MPIResult, starts: dict[int, dict], ends: list[dict],
            abort_kills_all: bool = False, vanished: dict[int, float] | None = None, flavour=None,
            launcher_signals: frozenset[int] | None = None) -> MPILaunchError:
    """The error for a job that exited non-zero, blaming the rank whose process ended first.

    ``flavour``: the MPI library's :class:`~workbench.mpilib.MPIFlavour` (default MPICH): where its abort lines
    are and which signals its launcher sends the other ranks (``launcher_signals``, when the launcher is
    not the library's own: srun).

    ``abort_kills_all``: the launcher answers an ``MPI_Abort`` by SIGKILLing every task at once,
    the aborting one included (srun), so whichever guard records its SIGKILL first says nothing:
    when one rank called ``MPI_Abort`` and every recorded end is a SIGKILL, that rank is named."""
    head = f"MPI job on {nranks} ranks exited with code {result.returncode}"
    lost = _SRUN_NODE_FAILURE.search(result.output)
    if lost:  # Slurm lost a node (its slurmd stopped answering): the ranks it then killed are not the cause
        node = lost.group(1)
        ranks = sorted(r for r, s in starts.items() if s.get("host") == node)
        on = f": rank {', '.join(map(str, ranks))} ran there" if ranks else ""
        return MPILaunchError(f"node {node} failed (srun: Node failure on {node}){on}; {head} (Slurm ended the job "
                              f"step, and with it the other ranks)\n{tail(result.output, 20)}", ranks, result.output)
    flavour = flavour or Mpich()
    traced = failed_ranks(result)
    # a rank that called MPI_Abort (mpi4py does on an uncaught exception) takes the others down with it
    # (hydra kills the fronts, the guards kill their ranks; prterun SIGTERMs them): its library's line names it
    codes = flavour.aborts({r: result.ranks.get(r, "") for r in traced}, result.output)  # rank -> its code
    aborted = set(codes.items())
    first = _first_death(result, starts, ends, abort_kills_all, set(codes),
                         flavour.stop_signals if launcher_signals is None else launcher_signals)
    raised = {r for r in traced if "Traceback (most recent call last)" in result.ranks.get(r, "")}
    if abort_kills_all:
        first = _killed_with_all(first, set(codes) or raised, starts, ends)
    # a guard that noted its launcher's death but vanished before recording its rank's end was killed
    # with it (its node's processes were killed): not a launcher that died under live guards
    orphaned = [e for e in ends if e.get("launcher_died")
                and (e.get("signal") or e.get("exit_code") or e.get("rank") not in (vanished or {}))]
    if orphaned and not traced and (first is None or orphaned[0].get("time", 0) <= first.get("time", 0)):
        return _orphaned(head, result, orphaned, nranks)  # nothing ended before the launcher's process died
    if first is None and vanished and not traced:  # ranks gone with their guards: their node's processes were killed
        return _vanished(head, result, starts, vanished)
    if first is None or not isinstance(first.get("rank"), int):
        who = f"rank(s) {', '.join(map(str, traced))} failed" if traced else "the job failed"
        detail = "\n".join(_traceback_of(result, r) for r in traced) or tail(result.output)
        if len(aborted) == 1:
            [(rank, code)] = aborted
            where = starts.get(rank, {})
            head = f"{who_is(rank, where.get('host'), where.get('pid'))} raised an exception and called MPI_Abort with code {code}: {head}"
        return MPILaunchError(f"{head}: {who}\n{detail}", traced, result.output)
    rank = first["rank"]
    blame = f"{who_is(rank, first.get('host'), first.get('pid'))} {describe_end(first)}"
    if rank in codes:  # how its process ended after MPI_Abort (a crash in the abort, a kill) says nothing
        blame = f"{who_is(rank, first.get('host'), first.get('pid'))} raised an exception and called MPI_Abort with code {codes[rank]}"
    elif abort_kills_all and rank in raised and first.get("signal") == 9:  # srun's kill of the rank that raised
        blame = f"{who_is(rank, first.get('host'), first.get('pid'))} raised an exception (srun then killed every task)"
    if rank in traced:  # it raised: its traceback says why
        return MPILaunchError(f"{blame}: {head}: rank(s) {rank} failed\n{_traceback_of(result, rank)}",
                              [rank], result.output)
    last_words = tail("\n".join(result.lines_of(rank)), 20)
    detail = f"\n--- rank {rank} ---\n{last_words}" if last_words.strip() else ""
    return MPILaunchError(f"{blame}; {head} (the other ranks were stopped after it){detail}",
                          [rank], result.output)


def _killed_with_all(first: dict | None, culprits: set[int], starts: dict[int, dict], ends: list[dict]) -> dict | None:
    """srun SIGKILLs every task once one fails (the failing one too, in its MPI_Abort): when every rank that
    ended badly, but the one that raised (``culprits``: its traceback, or its library's abort line), was
    SIGKILLed, the order of the SIGKILLs says nothing and that rank is the cause; else ``first``."""
    if (len(culprits) != 1 or first is None or first.get("rank") in culprits
            or not all(e.get("signal") == 9 for e in ends if ended_badly(e) and e.get("rank") not in culprits)):
        return first
    [rank] = culprits
    return next((e for e in ends if e.get("rank") == rank), None) or {
        "rank": rank, "host": starts.get(rank, {}).get("host"), "pid": starts.get(rank, {}).get("pid"), "signal": 9}


def _vanished(head: str, result: MPIResult, starts: dict[int, dict], vanished: dict[int, float]) -> MPILaunchError:
    """The error for ranks that vanished with their guards (no record of how they ended): the first
    to go is named, with the other ranks of its node that went too."""
    first = min(vanished, key=vanished.get)
    start = starts.get(first, {})
    host = start.get("host")
    others = sorted(r for r in vanished if r != first and host and starts.get(r, {}).get("host") == host)
    return MPILaunchError(
        f"{who_is(first, host, start.get('pid'))} vanished with its guard, with no record of how it ended (killed "
        f"from outside together with it: its node's processes were killed?)"
        + (f"; rank {', '.join(map(str, others))} on the same node went too" if others else "")
        + f"; {head} (the other ranks were stopped after it)\n{tail(result.output, 20)}", [first, *others], result.output)


def _orphaned(head: str, result: MPIResult, orphaned: list[dict], nranks: int) -> MPILaunchError:
    """The error for ranks whose guards ended them because the process that launched them died
    (:mod:`.rankguard`'s ``launcher_died``), naming that process and the node, the first first."""
    first = orphaned[0]
    host, pid = first.get("host"), first["launcher_died"]
    ranks = sorted(e["rank"] for e in orphaned if e.get("host") == host and e["launcher_died"] == pid)
    where = f" on node {host}" if host else ""
    others = "" if len(ranks) == nranks else " (the other ranks were stopped after them)"
    return MPILaunchError(
        f"the launcher's process{where} (pid {pid}: {first.get('launcher') or 'the node launcher'}) died while its "
        "ranks ran: "
        f"rank {', '.join(map(str, ranks))} ended by their guards; {head}{others}\n{tail(result.output, 20)}",
        ranks, result.output)


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _traceback_of(result: MPIResult, rank: int) -> str:
    lines = result.lines_of(rank)
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    aborts = [i for i, line in enumerate(lines) if _MPICH_ABORT.search(line)]
    start = (tracebacks or aborts or [0])[0]
    return f"--- rank {rank} ---\n" + "\n".join(lines[start:start + 60])
