"""Slurm across a virtual cluster: slurmctld on the head (listening on its bridge address only), one
slurmd per node; srun -N and sbatch -N span nodes, wb.Cluster(engines="slurm") starts engines on
them, `workbench train` under sbatch runs its ranks on several nodes, and a node whose slurmd is
killed ends the run with the node and rank named (Slurm notices in about 25 s).

Root only: Slurm's daemons run as root.
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

from vcluster_fixture import start, vcluster_name
from workbench.config import RunConfig
from workbench.runtime.client.cluster import Cluster
from workbench.vcluster import VirtualCluster
from workbench.vcluster.slurm import restart_slurmd, root_of, slurmd_pid

pytestmark = [pytest.mark.mpi, pytest.mark.slurm, pytest.mark.vcluster]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    vc = start(VirtualCluster(vcluster_name("s"), nodes=3, bandwidth="1gbit", slurm=True,
                              shared=tmp_path_factory.mktemp("svc-shared")))
    try:
        yield vc
    finally:
        vc.down()
    assert not root_of(vc).exists()


def _slurm(vc, *argv, timeout=120, **kwargs):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **vc.slurm_env()}
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=kwargs.pop("cwd", vc.shared), **kwargs)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _wait_job(vc, job: str, timeout: float = 120) -> float:
    started = time.monotonic()
    while _slurm(vc, "squeue", "-h", "-j", job).stdout.strip():
        assert time.monotonic() - started < timeout, f"job {job} still in squeue after {timeout} s"
        time.sleep(0.5)
    return time.monotonic() - started


def test_srun_spans_the_nodes_and_slurmctld_listens_on_the_head_only(svc):
    nodes = _slurm(svc, "sinfo", "-h", "-N", "-o", "%N %T").stdout.split("\n")[:-1]
    assert sorted(nodes) == [f"{svc.name}-{i} idle" for i in range(3)]
    hosts = _slurm(svc, "srun", "-N", "3", "-n", "3", "hostname").stdout.split()
    assert sorted(hosts) == [f"{svc.name}-{i}" for i in range(3)]
    hello = _slurm(svc, "srun", "-N", "2", "-n", "4", sys.executable, "-c",
                   "from mpi4py import MPI; import os, socket; c = MPI.COMM_WORLD; "
                   "print(c.rank, c.size, socket.gethostname(), os.environ['FI_PROVIDER'])")
    assert hello.returncode == 0, hello.stderr
    lines = sorted(hello.stdout.split("\n")[:-1])
    assert [line.split()[:2] for line in lines] == [[str(r), "4"] for r in range(4)]  # one MPI job (pmi2)
    assert {line.split()[2] for line in lines} == {f"{svc.name}-0", f"{svc.name}-1"} and "tcp" in lines[0]
    listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    pid = (root_of(svc) / "slurmctld.pid").read_text().strip()
    ctld = [line.split()[3] for line in listening.splitlines() if f"pid={pid}," in line]
    assert ctld and all(addr.startswith(svc.head_address + ":") for addr in ctld), listening


def test_sbatch_workbench_train_runs_its_ranks_on_several_nodes(svc, tmp_path):
    out, store = svc.shared / "sbatch-run", svc.shared / "store.sqlite"
    job = _slurm(svc, "sbatch", "--parsable", "-N", "2", "-n", "4", "-o", str(svc.shared / "train-%j.out"), "--wrap",
                 f"{sys.executable} -m workbench.cli train --algorithm sync-sgd --ranks 4 --epochs 2 "
                 f"--out {out} --store {store}", cwd=ROOT).stdout.strip().split(";")[0]
    _wait_job(svc, job)
    text = (svc.shared / f"train-{job}.out").read_text()
    assert f"srun in Slurm job {job}" in text, text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 4 and summary["final_test_accuracy"] > 0.5


def test_slurm_engines_span_the_nodes(svc):
    with Cluster(n=3, engines="slurm", vcluster=svc) as cluster:
        assert os.environ["SLURM_CONF"] == svc.slurm_env()["SLURM_CONF"]
        assert sorted(cluster.hosts.values()) == [f"{svc.name}-{i}" for i in range(3)]
        result = cluster.train(RunConfig(algorithm="sync-easgd", ranks=3, epochs=1), svc.shared / "engines-run",
                               store=False).wait(120)
        assert result.status == "finished"
    assert os.environ.get("SLURM_CONF") != svc.slurm_env()["SLURM_CONF"]  # put back as it was


def test_a_killed_slurmd_fails_the_run_naming_node_and_rank_and_the_node_comes_back(svc):
    out, store = svc.shared / "slurmd-fault", svc.shared / "fault.sqlite"
    job = _slurm(svc, "sbatch", "--parsable", "-N", "3", "-n", "3", "-o", str(svc.shared / "fault-%j.out"), "--wrap",
                 f"{sys.executable} -m workbench.cli train --algorithm sync-sgd --ranks 3 --epochs 5000 "
                 f"--out {out} --store {store}", cwd=ROOT).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while not (out / "config.json").exists() or not list((out / "job").glob("*/ranks/rank2.start")):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)
    os.kill(slurmd_pid(svc, 1), signal.SIGKILL)
    killed = time.monotonic()
    _wait_job(svc, job)
    said = f"workbench train: node {svc.name}-1 failed (Slurm: down"
    while said not in (text := (svc.shared / f"fault-{job}.out").read_text()):  # the batch script's last words
        assert time.monotonic() - killed < 60, text
        time.sleep(0.2)
    assert "rank 1 ran there" in text and time.monotonic() - killed < 60
    row = subprocess.run([sys.executable, "-m", "workbench.cli", "runs", "--store", str(store)], capture_output=True,
                         text=True).stdout
    assert " failed " in row
    restart_slurmd(svc, 1)
    deadline = time.monotonic() + 60
    while _slurm(svc, "sinfo", "-h", "-n", f"{svc.name}-1", "-o", "%T").stdout.strip() != "idle":
        assert time.monotonic() < deadline, "the node did not come back"
        time.sleep(0.5)
    deadline = time.monotonic() + 30  # the step Slurm could not reach while slurmd was gone ends now
    while [p for i in range(3) for p in svc.processes(i) if "workbench.runtime.rank.worker" in _cmdline(p)]:
        assert time.monotonic() < deadline, "ranks left running on a node"
        time.sleep(0.5)
    hosts = _slurm(svc, "srun", "-N", "3", "-n", "3", "hostname").stdout.split()
    assert sorted(hosts) == [f"{svc.name}-{i}" for i in range(3)]


def test_a_restart_stays_in_a_no_kill_allocation_on_the_nodes_it_still_holds(svc):
    """Issue 46 under Slurm: `sbatch -N 3 --no-kill` keeps the allocation when a node crashes; Slurm ends the job
    step (srun's "Node failure"), takes the node out of the job, and `--max-restarts 1 --min-ranks 2` starts the
    run again from its checkpoint inside the same allocation, on the 2 nodes it still holds; nothing is left."""
    out, store = svc.shared / "no-kill", svc.shared / "no-kill.sqlite"
    job = _slurm(svc, "sbatch", "--parsable", "-N", "3", "-n", "3", "--no-kill", "-o", str(svc.shared / "nokill-%j.out"),
                 "--wrap", f"{sys.executable} -m workbench.cli train --algorithm sync-sgd --ranks 3 --epochs 60 "
                 f"--checkpoint-every 50 --max-restarts 1 --min-ranks 2 --out {out} --store {store} --no-progress",
                 cwd=ROOT).stdout.strip().split(";")[0]
    live, deadline = out / "live" / "rank2.jsonl", time.monotonic() + 90
    try:
        while not (live.exists() and any(r.get("step", 0) >= 60 for line in live.read_text().splitlines()
                                         for r in json.loads(line).get("metrics", ()))):
            assert time.monotonic() < deadline and _slurm(svc, "squeue", "-h", "-j", job).stdout.strip(), \
                "the run did not reach step 60"
            time.sleep(0.1)
        assert svc.kill_node(1, down=True)
        killed = time.time()
        _wait_job(svc, job, timeout=180)
        text = (svc.shared / f"nokill-{job}.out").read_text()
        summary = json.loads((out / "summary.json").read_text())
        [fault] = summary["restarts"]
        assert summary["world_sizes"] == [3, 2] and fault["nodes_lost"] == [f"{svc.name}-1"] and fault["rank"] == 1, text
        assert f"node {svc.name}-1 failed (srun: Node failure on {svc.name}-1): rank 1 ran there" in fault["cause"]
        assert f"on 2 ranks ({svc.name}-1 left out: no longer in Slurm job {job})" in text, text
        assert "it goes on at 2 ranks (3 before)" in text and fault["detected"] > killed, text
        # the whole run counted: its clock spans the fault, its bytes both incarnations'
        assert summary["wall_seconds"] > fault["detected"] - killed and fault["bytes_sent"] > 0, summary
        assert summary["bytes_sent"] > fault["bytes_sent"] and summary["final_test_accuracy"] > 0.5, summary
        assert not [p for i in (0, 2) for p in svc.processes(i) if "workbench.runtime.rank.worker" in _cmdline(p)]
    finally:
        svc.restore(1)
        restart_slurmd(svc, 1)
        deadline = time.monotonic() + 60
        while _slurm(svc, "sinfo", "-h", "-n", f"{svc.name}-1", "-o", "%T").stdout.strip() != "idle":
            assert time.monotonic() < deadline, "the node did not come back"
            time.sleep(0.5)
