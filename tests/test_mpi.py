"""Collectives over real MPI: each test launches mpiexec (see the ``mpi`` fixture)."""
from __future__ import annotations

import mmap
import os
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from workbench.collectives import schedules
from workbench.runtime.launch.launcher import MPILaunchError, run_mpi
from workbench.runtime.launch.leftovers import mapped_shm, remove_leftovers

pytestmark = pytest.mark.mpi


CASE_FILES = ("tests/mpi/allreduce_cases.py", "tests/mpi/nonblocking_cases.py", "tests/mpi/strategy_cases.py")


@pytest.fixture(scope="module")
def collected() -> dict[str, int]:
    """How many cases each of :data:`CASE_FILES` holds (collected together in one one-rank process:
    one torch import instead of three)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-o", "addopts=", *CASE_FILES], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent).stdout
    counts = {path: sum(line.startswith(path + "::") for line in out.splitlines()) for path in CASE_FILES}
    total = int(re.search(r"(\d+) tests? collected", out).group(1))
    assert sum(counts.values()) == total, out[-2000:]
    return counts


def assert_every_rank_passed(result, nranks: int, expected: int) -> None:
    """Every rank's pytest summary says ``expected`` passed, nothing failed or errored."""
    for rank in range(nranks):
        summary = [line for line in result.lines_of(rank) if re.search(r"\d+ passed", line)]
        assert summary, f"rank {rank} printed no pytest summary:\n{result.output[-3000:]}"
        assert "failed" not in summary[-1] and "error" not in summary[-1], summary[-1]
        passed = int(re.search(r"(\d+) passed", summary[-1]).group(1))
        assert passed == expected, summary[-1]  # the whole matrix ran on every rank


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])  # 3: the non-power-of-two case (3 = 2 + 1 as 5 = 4 + 1)
def test_case_suites_under_mpiexec(mpi, nranks, collected):
    """The three case suites in one job per rank count (one torch import a rank instead of three):

    - allreduce_cases: every algorithm x dtype x odd length, numpy and torch, against MPI_Allreduce;
    - nonblocking_cases (2 ranks and more): iallreduce, every algorithm x dtype x odd length against
      the blocking path, handles in flight together and waited in rank-dependent orders, progress(),
      timeouts, mismatches;
    - strategy_cases: GradientFlow's strategies on real models: fusion buckets and message counts,
      fused sums against a per-tensor blocking all-reduce, overlap, CSC's selection (identical on
      every rank), wire bytes against the formulas, residual conservation, ratio 1 as momentum SGD,
      injected wire overflows skipping the step on every rank, and the ablations' code paths.
    """
    assert collected["tests/mpi/allreduce_cases.py"] > 190
    assert collected["tests/mpi/nonblocking_cases.py"] > 100
    assert collected["tests/mpi/strategy_cases.py"] > 100
    files = [f for f in CASE_FILES if nranks > 1 or "nonblocking" not in f]
    result = mpi(nranks, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *files, timeout=600)
    assert_every_rank_passed(result, nranks, sum(collected[f] for f in files))


@pytest.mark.parametrize("algorithm", [*schedules.SCHEDULES, "native"])
def test_mismatched_lengths_fail_fast_with_a_clear_error(algorithm, tmp_path):
    start = time.monotonic()
    with pytest.raises(MPILaunchError) as info:
        run_mpi(3, ["tests/mpi/mismatch.py", algorithm], timeout=60)
    assert time.monotonic() - start < 30
    assert "no error raised" not in info.value.output
    assert info.value.failed_ranks, info.value.output
    if algorithm != "native":  # native's message is MPICH's own
        assert "ranks passed buffers of different lengths" in str(info.value)


def test_a_rank_that_raises_is_named_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(MPILaunchError) as info:
        run_mpi(4, ["tests/mpi/failing_rank.py", "raise", "2"], timeout=60)
    assert time.monotonic() - start < 30
    assert info.value.failed_ranks == [2]
    assert "rank(s) 2 failed" in str(info.value)
    assert "RuntimeError: injected failure on rank 2" in str(info.value)


def test_a_ranks_last_words_are_kept_when_the_launcher_dies_before_forwarding_them():
    """The rank writes to stderr while hydra's proxy, which forwards its output, is stopped, then the
    proxy is killed (as when MPI_Abort has the proxy end the job before it read the aborting rank's
    last words): the rank guard writes the rank's output itself, so the words are there."""
    with pytest.raises(MPILaunchError) as info:
        run_mpi(3, ["tests/mpi/failing_rank.py", "unforwarded", "1"], timeout=60)
    assert "--- rank 1 ---\nlast words of rank 1" in info.value.output, info.value.output


def test_ranks_whose_launcher_process_dies_are_ended_and_the_error_names_it():
    """Hydra's proxy (the guards' parent, which forwards signals and reports the ranks' ends) is
    killed while its ranks live: the guards end their ranks, and the job fails at once naming the
    dead process and its node, instead of hanging until the deadline with every rank left running."""
    marker = f"orphan-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    with pytest.raises(MPILaunchError) as info:
        run_mpi(3, ["tests/mpi/failing_rank.py", "unforwarded", "1", marker], timeout=120)
    assert time.monotonic() - start < 60, info.value
    message = str(info.value).splitlines()[0]
    assert re.match(r"the launcher's process on node \S+ \(pid \d+: hydra_pmi_proxy\) died while its "
                    r"ranks ran: rank 0, 1, 2 ended by their guards; MPI job on 3 ranks exited", message), message
    assert info.value.failed_ranks == [0, 1, 2]
    left = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert not left, left


def test_a_hanging_rank_is_killed_at_the_timeout():
    start = time.monotonic()
    with pytest.raises(MPILaunchError, match="ran past its 5 s timeout"):
        run_mpi(3, ["tests/mpi/failing_rank.py", "hang", "1"], timeout=5)
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_rank_count_is_refused_before_launch(bad):
    with pytest.raises(ValueError, match="nranks must be an integer >= 1; got"):
        run_mpi(bad, ["-c", "pass"])


def test_failed_jobs_leave_no_shared_memory_behind():
    before = {p.name for p in Path("/dev/shm").glob("mpich_shm_*")}
    for args in (["tests/mpi/failing_rank.py", "raise", "1"], ["tests/mpi/failing_rank.py", "hang", "1"]):
        with pytest.raises(MPILaunchError):
            run_mpi(3, args, timeout=5)
    new = {p.name for p in Path("/dev/shm").glob("mpich_shm_*")} - before
    # a segment another job made meanwhile is mapped by its processes; ours would be mapped by none
    assert not new - mapped_shm(), new


def test_leftovers_removed_are_only_our_own_unused_files(tmp_path):
    """A killed job's segment goes; one a live process maps, holds open or names in its environment
    stays, and so do another user's file and a planted link: skipped, never an error."""
    def made(name: str) -> Path:
        path = tmp_path / name
        path.write_bytes(b"\0" * 4096)
        return path
    orphan, live, held = made("mpich_shm_orphan_0"), made("mpich_shm_live_0"), made("Intel_MPI_held")
    named, theirs = made("hydra_hwloc_xmlfile_named"), made("sm_segment.vm.0.theirs")
    os.chown(theirs, 65534, 65534)  # nobody's: a file another user has, or planted
    (tmp_path / "mpich_shm_link").symlink_to(live)
    stale = made("hydra_hwloc_xmlfile_stale")
    sleeper = subprocess.Popen(["sleep", "60"], env={"HWLOC_XMLFILE": str(named)})
    try:
        with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096), open(held, "rb"):
            removed = remove_leftovers({"/dev/shm": tmp_path, "tmp": tmp_path})
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(removed) == ["hydra_hwloc_xmlfile_stale", "mpich_shm_orphan_0"]
    assert not orphan.exists() and not stale.exists()
    assert live.exists() and held.exists() and named.exists() and theirs.exists()
    assert (tmp_path / "mpich_shm_link").is_symlink()
