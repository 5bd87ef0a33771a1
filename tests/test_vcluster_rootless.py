"""A virtual cluster for a user who is not root: the CLI run as ``nobody`` builds the same cluster
inside a user namespace, runs commands and an MPI job across its nodes, and removes it; where the
kernel forbids user namespaces, the one-line error that names the setting. Slurm stays root's."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from users import NOBODY, as_user
from vcluster_fixture import vcluster_name

pytestmark = [pytest.mark.mpi, pytest.mark.vcluster]

ROOT = Path(__file__).resolve().parent.parent


def _as_nobody(argv: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``argv`` as uid/gid 65534 with no capabilities (:func:`users.as_user`)."""
    return as_user(NOBODY, NOBODY, argv, env, timeout)


@pytest.fixture
def nobody_env():
    state = Path(tempfile.mkdtemp(prefix="wbtest-nobody-"))
    os.chown(state, NOBODY, NOBODY)  # its own state folder: 0700 and nobody's (workbench refuses one others may write)
    runtime = Path(tempfile.gettempdir()) / f"workbench-vcluster-{NOBODY}"
    env = {**{k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR",)}, "WORKBENCH_STATE_DIR": str(state),
           "HOME": str(state), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    yield env
    shutil.rmtree(state, ignore_errors=True)
    if runtime.is_dir() and not any(runtime.iterdir()):  # the registry nobody's `up` made, empty again
        shutil.rmtree(runtime, ignore_errors=True)


def test_nobody_gets_a_cluster_in_a_user_namespace_or_the_reason(nobody_env):
    name = vcluster_name("u")
    cli = [sys.executable, "-m", "workbench.cli", "vcluster"]
    reason = _as_nobody([sys.executable, "-c", "from workbench.vcluster.rootless import why_no_user_namespaces as w; "
                                               "print(w() or '')"], nobody_env)
    assert reason.returncode == 0, reason.stderr
    up = _as_nobody([*cli, "up", name, "--nodes", "2", "--bandwidth", "100mbit"], nobody_env)
    if reason.stdout.strip():  # this kernel forbids it: the error says so, on one line
        assert up.returncode == 1 and reason.stdout.strip() in up.stderr and len(up.stderr.strip().splitlines()) == 1
        return
    assert up.returncode == 0, up.stderr
    try:
        record = json.loads((Path(tempfile.gettempdir()) / f"workbench-vcluster-{NOBODY}" / name / "cluster.json")
                            .read_text())
        holder = psutil.Process(record["holder"]["pid"])
        assert holder.uids().real == NOBODY  # the cluster's namespaces belong to nobody, not to root
        assert not any(n.startswith(f"wbv-{name}-") for n in os.listdir("/var/run/netns"))  # not in root's
        hosts = [_as_nobody([*cli, "exec", name, "--node", str(i), "--", "hostname"], nobody_env).stdout.strip()
                 for i in range(2)]
        assert hosts == [f"{name}-0", f"{name}-1"]
        hello = _as_nobody([*cli, "mpiexec", name, "-n", "2", "--", sys.executable, "-c",
                            "from mpi4py import MPI; import os, socket; "
                            "os.write(1, f'rank {MPI.COMM_WORLD.rank} {socket.gethostname()}\\n'.encode())"], nobody_env)
        assert sorted(re.findall(rf"rank \d {name}-\d", hello.stdout)) == [f"rank 0 {name}-0", f"rank 1 {name}-1"], \
            hello.stdout + hello.stderr
        status = json.loads(_as_nobody([*cli, "status", name, "--json"], nobody_env).stdout)
        assert sum(link["bytes_sent"] for link in status["links"]) > 0
        slurm = _as_nobody([*cli, "up", vcluster_name("v"), "--nodes", "2", "--slurm"], nobody_env)
        assert slurm.returncode == 1 and "slurm: Slurm's daemons run as root" in slurm.stderr
    finally:
        down = _as_nobody([*cli, "down", name], nobody_env)
    assert down.returncode == 0 and "down" in down.stdout, down.stderr
    assert not holder.is_running() or holder.status() == psutil.STATUS_ZOMBIE
    assert "no virtual cluster is up" in _as_nobody([*cli, "list"], nobody_env).stdout
