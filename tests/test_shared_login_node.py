"""A login node shared with another user: two real Linux users made for the test. The owner trains from
the CLI; the attacker, with nothing but what any user has, tries what issue 45 found: connecting and
sending hydra's 12 bytes to every port the owner's processes listen on, reading every file the
owner's runs make, planting a ``/dev/shm`` segment and hydra's topology file for the owner's clean-up to
trip on, and planting the owner's virtual-cluster registry in ``/tmp``. Each attack fails, the owner's
run ends as it does unattacked, and nothing of the owner's is left."""
from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from users import as_user, as_user_argv, made_user

pytestmark = [pytest.mark.mpi]

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["-m", "workbench.cli", "train", "--algorithm", "sync-sgd", "--ranks", "4", "--dataset", "digits",
         "--model", "mlp"]

#: the attacker's scan: every TCP port the owner's uid listens on (``/proc/net/tcp*``: any user reads
#: them), connected to on every local address and sent hydra's header; what it found, as JSON
ATTACK = r"""
import json, socket, sys
owner = sys.argv[1]
found, sent = [], 0
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[7] == owner:  # LISTEN, the owner's uid
            found.append(int(f[1].split(":")[1], 16))
for port in found:
    for host in ("127.0.0.1", socket.gethostname()):
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.sendall(b"HYD\0" + b"\0" * 8)
                sent += 1
        except OSError:
            pass
print(json.dumps({"ports": found, "sent": sent}))
"""

#: the attacker tries to open every file and list every folder it is given
READ = r"""
import json, os, sys
read = []
for path in json.load(sys.stdin):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        read.append(path)
    except OSError:
        pass
print(json.dumps(read))
"""


def _env(user, **extra) -> dict:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("WORKBENCH_", "XDG_", "SLURM_"))}
    return {**keep, "HOME": user.pw_dir, "OMP_NUM_THREADS": "1", "TMPDIR": "/tmp",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}


def _checksum(stdout: str) -> str:
    return re.search(r"weights_checksum\s+(\S+)", stdout).group(1)


def _everything_under(*folders: Path) -> list[str]:
    paths = []
    for folder in folders:
        for base, dirs, files in os.walk(folder):
            paths += [os.path.join(base, name) for name in dirs + files]
    return paths


def _owned_by(uid: int, folder: str, prefixes: tuple[str, ...]) -> list[str]:
    return [p.name for p in Path(folder).iterdir() if p.name.startswith(prefixes) and p.lstat().st_uid == uid]


def _processes_of(uid: int, timeout: float = 10) -> list[str]:
    """The user's processes still running after ``timeout`` s (a zombie that init has yet to reap is gone)."""
    import psutil
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for p in psutil.process_iter(["uids", "status", "cmdline"]):
            if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.info["cmdline"] or []))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> str:
    """The checksum of the run, as root and unattacked."""
    tmp = tmp_path_factory.mktemp("plain")
    done = subprocess.run([sys.executable, *TRAIN, "--epochs", "30", "--store", str(tmp / "s.sqlite"),
                           "--out", str(tmp / "plain")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return _checksum(done.stdout)


@pytest.fixture(scope="module")
def users():
    with made_user("o") as owner, made_user("a") as attacker:
        yield owner, attacker


def test_another_user_cannot_stop_read_or_break_a_cli_run(users, plain):
    owner, attacker = users
    home = Path(owner.pw_dir)
    env = _env(owner)
    store = home / "runs.sqlite"

    # the attacker's files, planted before the owner runs: a segment and hydra's topology file
    planted = [f"/dev/shm/mpich_shm_{attacker.pw_name}", f"/tmp/hydra_hwloc_xmlfile_{attacker.pw_name}"]
    done = as_user(attacker.pw_uid, attacker.pw_gid, ["sh", "-c", " && ".join(f"touch {p}" for p in planted)],
                   _env(attacker))
    assert done.returncode == 0, done.stderr

    run = subprocess.Popen(as_user_argv(owner.pw_uid, owner.pw_gid, [sys.executable, *TRAIN, "--epochs", "30",
                                                                     "--store", str(store), "--out",
                                                                     str(home / "attacked")]),
                           cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((home / "attacked").glob("job/*/ranks/rank3.start*")):
            assert run.poll() is None and time.monotonic() < deadline, "the owner's run never started"
            time.sleep(0.2)
        scan = as_user(attacker.pw_uid, attacker.pw_gid, [sys.executable, "-c", ATTACK, str(owner.pw_uid)],
                       _env(attacker))
        assert scan.returncode == 0, scan.stderr
        assert run.poll() is None  # the attack came while the run ran
        listened = json.loads(scan.stdout)
        seen = subprocess.run(["ss", "-Htlnpu"], capture_output=True, text=True).stdout
        during = _everything_under(home)
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()
    # nothing of the running job listened where the attacker could reach it
    assert listened == {"ports": [], "sent": 0}, (listened, seen)
    assert run.returncode == 0, err
    assert _checksum(out) == plain  # the same bits as the run nobody attacked

    # every file and folder the owner's runs made, read by the attacker: none opens
    after = _everything_under(home)
    assert len(after) > 10
    read = subprocess.run(as_user_argv(attacker.pw_uid, attacker.pw_gid, [sys.executable, "-c", READ]),
                          input=json.dumps(sorted(set(during + after + [str(home)]))), capture_output=True,
                          text=True, timeout=60, env=_env(attacker), cwd="/")
    assert read.returncode == 0 and json.loads(read.stdout) == [], read.stdout + read.stderr

    # a failing run meets the planted files in its clean-up: the rank's error is what the store keeps
    failing = as_user(owner.pw_uid, owner.pw_gid, [sys.executable, *TRAIN, "--epochs", "3", "--fail-rank", "2",
                                                   "--fail-step", "3", "--store", str(store), "--out",
                                                   str(home / "failing")], env, timeout=300)
    assert failing.returncode == 1
    assert "rank 2 on node" in failing.stderr and "Operation not permitted" not in failing.stderr, failing.stderr
    with sqlite3.connect(store) as db:
        rows = dict(db.execute("select status, error from runs where run_id = 'failing'").fetchall())
    assert "failed" in rows and "injected failure on rank 2" in rows["failed"], rows
    assert all(os.path.exists(p) for p in planted)  # the attacker's files, untouched
    for p in planted:
        os.unlink(p)

    # nothing of the owner's is left: no process, no segment, no topology file
    assert _processes_of(owner.pw_uid) == []
    assert _owned_by(owner.pw_uid, "/dev/shm", ("mpich_shm_", "Intel_MPI_", "sm_segment.")) == []
    assert _owned_by(owner.pw_uid, "/tmp", ("hydra_hwloc_xmlfile_",)) == []


def test_a_planted_registry_or_state_folder_is_refused_in_one_line(users):
    owner, attacker = users
    registry = Path(tempfile.gettempdir()) / f"workbench-vcluster-{owner.pw_uid}"
    shutil.rmtree(registry, ignore_errors=True)
    planted = as_user(attacker.pw_uid, attacker.pw_gid, [
        sys.executable, "-c", f"import os, json; os.mkdir({str(registry)!r}, 0o777); os.chmod({str(registry)!r}, 0o777);"
        f"os.mkdir({str(registry / 'x')!r}); open({str(registry / 'x' / 'cluster.json')!r}, 'w').write("
        "json.dumps({'name': 'x', 'holder': {'pid': 1, 'started': 0}, 'nodes': 2}))"], _env(attacker))
    assert planted.returncode == 0, planted.stderr
    try:
        for command in (["list"], ["down", "x"]):
            done = as_user(owner.pw_uid, owner.pw_gid, [sys.executable, "-m", "workbench.cli", "vcluster", *command],
                           _env(owner))
            assert done.returncode == 2, done.stdout + done.stderr
            line = done.stderr.strip()
            assert "\n" not in line and str(registry) in line and f"belongs to uid {attacker.pw_uid}" in line, line
    finally:
        shutil.rmtree(registry, ignore_errors=True)

    # a state folder others may write: refused before anything starts, notebook and CLI alike
    state = Path(owner.pw_dir) / "open-state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    os.chown(state, owner.pw_uid, owner.pw_gid)
    env = _env(owner, WORKBENCH_STATE_DIR=str(state))
    done = as_user(owner.pw_uid, owner.pw_gid, [sys.executable, "-c", "import workbench as wb; wb.Cluster(n=2).start()"],
                   env)
    assert done.returncode == 1 and f"UnsafeFolder: {state} may be written by group and others" in done.stderr
    assert not any(state.iterdir())

    # a state folder of yours that others may read (an older workbench made it 0755): made 0700
    state.chmod(0o755)
    done = as_user(owner.pw_uid, owner.pw_gid, [sys.executable, "-c", "from workbench.paths import state_dir; "
                                                "state_dir()"], env)
    assert done.returncode == 0 and state.stat().st_mode & 0o777 == 0o700, done.stderr

    # a connection file (a cluster's key) that others may read: refused, named, before anything starts
    security = state / "ipython" / "security"
    security.mkdir(parents=True)
    key = security / "ipcontroller-old-client.json"
    key.write_text("{}")
    key.chmod(0o644)
    cluster_file = security / "cluster-old.json"  # ipyparallel's cluster file holds no key: 0644 is fine
    cluster_file.write_text("{}")
    cluster_file.chmod(0o644)
    for path in (state / "ipython", security, key, cluster_file):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    done = as_user(owner.pw_uid, owner.pw_gid, [sys.executable, "-c", "import workbench as wb; wb.Cluster(n=2).start()"],
                   env)
    assert done.returncode == 1, done.stderr
    assert f"UnsafeFolder: {key} holds a secret and may be read or written by others (mode 644); chmod 600" in done.stderr
    key.chmod(0o600)  # the key file mended: the cluster file alone stops nothing
    done = as_user(owner.pw_uid, owner.pw_gid, [sys.executable, "-c", "from pathlib import Path; from workbench."
                                                "runtime.client.ipp_setup import check_keys; check_keys(Path("
                                                f"{str(state)!r}))"], env)
    assert done.returncode == 0, done.stderr


#: the owner's notebook: a cluster and a run; it says where its sockets are, waits for the attack, and
#: reports the result
NOTEBOOK = r"""
import json, os, sys, time
import workbench as wb
signal_file, go_file = sys.argv[1], sys.argv[2]
with wb.Cluster(n=4) as cluster:
    run = cluster.train(wb.RunConfig(algorithm="sync-sgd", ranks=4, dataset="digits", model="mlp", epochs=30),
                        store=False)
    while len(run.history) < 5:
        time.sleep(0.05)
    with open(signal_file + ".tmp", "w") as f:
        json.dump({"sockets": cluster.sockets, "pids": list(cluster.pids.values())}, f)
    os.rename(signal_file + ".tmp", signal_file)
    deadline = time.monotonic() + 120
    while not os.path.exists(go_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    running = not run.done()
    result = run.wait(300)
    print(json.dumps({"checksum": result.summary["weights_checksum"], "attacked_while_running": running,
                      "rejected": run.rejected_messages}))
"""

#: the attacker connects to every Unix socket in the owner's sockets folder
UNIX = r"""
import json, os, socket, sys
folder, reached = sys.argv[1], []
try:
    names = os.listdir(folder)
except OSError as exc:
    names = [f"c-{n}" for n in range(3)]  # cannot even list it: try names as they would be
for name in names:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(os.path.join(folder, name))
            reached.append(name)
    except OSError:
        pass
print(json.dumps(reached))
"""


def test_another_user_cannot_reach_or_stop_a_notebook_cluster(users, plain):
    owner, attacker = users
    home = Path(owner.pw_dir)
    signal_file, go_file = home / "started.json", home / "go"
    notebook = subprocess.Popen(as_user_argv(owner.pw_uid, owner.pw_gid, [sys.executable, "-c", NOTEBOOK,
                                                                          str(signal_file), str(go_file)]),
                                cwd=home, env=_env(owner), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not signal_file.exists():
            assert notebook.poll() is None and time.monotonic() < deadline, notebook.communicate()
            time.sleep(0.1)
        started = json.loads(signal_file.read_text())
        scan = as_user(attacker.pw_uid, attacker.pw_gid, [sys.executable, "-c", ATTACK, str(owner.pw_uid)],
                       _env(attacker))
        unix = as_user(attacker.pw_uid, attacker.pw_gid, [sys.executable, "-c", UNIX, str(started["sockets"])],
                       _env(attacker))
        stat = os.stat(started["sockets"]) if started["sockets"] else None
        go_file.touch()
        out, err = notebook.communicate(timeout=300)
    finally:
        notebook.kill()
    assert notebook.returncode == 0, err[-3000:]
    said = json.loads(out.strip().splitlines()[-1])
    assert said["attacked_while_running"] and said["rejected"] == 0
    assert json.loads(scan.stdout) == {"ports": [], "sent": 0}, scan.stdout + scan.stderr
    assert json.loads(unix.stdout) == [], unix.stdout + unix.stderr
    assert stat.st_uid == owner.pw_uid and stat.st_mode & 0o777 == 0o700
    assert said["checksum"] == plain  # the same bits as the CLI's run nobody attacked
    assert not os.path.exists(started["sockets"])  # stop removed the sockets' folder
    assert _processes_of(owner.pw_uid) == []


def test_the_network_setting_is_checked_and_told(tmp_path):
    """``WORKBENCH_NETWORK``: a word that is no mode is one line before anything starts (no run folder);
    ``workbench info`` says which network a job on this host gets."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKBENCH_NETWORK": "bogus"}
    done = subprocess.run([sys.executable, *TRAIN, "--epochs", "1", "--store", str(tmp_path / "s.sqlite"),
                           "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "WORKBENCH_NETWORK='bogus' is not one of auto, private, host" in done.stderr
    assert not (tmp_path / "run").exists()
    said = {}
    for network in ("auto", "host"):
        info = subprocess.run([sys.executable, "-m", "workbench.cli", "info"], capture_output=True, text=True,
                              env={**env, "WORKBENCH_NETWORK": network}, timeout=120)
        said[network] = next(line for line in info.stdout.splitlines() if line.startswith("single-host jobs"))
    assert "a network of their own (WORKBENCH_NETWORK=auto)" in said["auto"]  # user namespaces work here
    assert "the host's network (WORKBENCH_NETWORK=host)" in said["host"]
