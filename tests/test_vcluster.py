"""The virtual cluster for real: namespaced nodes, shaped links, MPI across nodes, the CLI contract,
and faults (a partition, a node's processes killed) ending runs with the node and rank named.

Root only (CI runs as root); without namespaces every test fails at setup with the reason.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vcluster_fixture import start, vcluster_name
from workbench.runtime.launch.launcher import MPILaunchError, run_mpi
from workbench.vcluster import VirtualCluster, registry, tools

pytestmark = [pytest.mark.mpi, pytest.mark.vcluster]

ROOT = Path(__file__).resolve().parent.parent
WORKBENCH = [sys.executable, "-m", "workbench.cli"]
#: every rank sums 4 MiB with the ring schedule, then prints its host
ALLREDUCE = """
import socket, sys
import numpy as np
from mpi4py import MPI
from workbench.comm import allreduce
comm = MPI.COMM_WORLD
data = np.full(1 << 20, comm.rank, dtype=np.float32)
allreduce(data, comm, "ring")
assert data[0] == sum(range(comm.size)), data[0]
print("host", comm.rank, socket.gethostname(), flush=True)
"""
#: all-reduces until killed
FOREVER = """
import time
import numpy as np
from mpi4py import MPI
a = np.ones(1 << 14)
while True:
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)
    time.sleep(0.01)
"""


def _program(vc, name: str, text: str) -> str:
    path = vc.shared / name
    path.write_text(text)
    return str(path)


def _sent(vc) -> dict:
    """bytes sent so far by each shaped link: (node or None, device) -> bytes."""
    return {(link["node"], link["device"]): link["bytes_sent"] for link in vc.status()["links"]}


def _ours(name: str) -> dict:
    """What this machine holds of cluster ``name``: its network namespaces, interfaces, mounts, folder."""
    netns = [n for n in os.listdir("/var/run/netns") if n.startswith(f"wbv-{name}-")] \
        if os.path.isdir("/var/run/netns") else []
    out = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout
    links = [link["ifname"] for link in json.loads(out or "[]") if link["ifname"].startswith(f"wbv{name}-")]
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f"/{name}/" in line
              and "workbench-vcluster" in line]
    return {"netns": netns, "links": links, "mounts": mounts, "folder": registry.folder(name).exists()}


def _nothing_runs(vc) -> list:
    return [(i, vc.processes(i)) for i in range(vc.nodes) if vc.processes(i)]


# -- what a node is ---------------------------------------------------------------------------
def test_nodes_have_their_own_name_address_tmp_shm_and_ipc_and_share_one_folder(vc4):
    names = [vc4.exec(i, ["hostname"]).stdout.strip() for i in range(4)]
    assert names == [f"{vc4.name}-{i}" for i in range(4)]
    addresses = vc4.exec(2, ["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
    assert f"{vc4.addresses[2]}/24" in addresses and vc4.addresses[2].startswith("198.1")
    marker = f"wbtest-{os.getpid()}"
    write = f"echo here > /tmp/{marker} && echo here > /dev/shm/{marker} && ipcmk -M 4096 >/dev/null"
    assert vc4.exec(0, ["sh", "-c", write]).returncode == 0
    try:
        look = f"ls /tmp/{marker} /dev/shm/{marker}; ipcs -m | grep -c '^0x' || true"
        other = vc4.exec(1, ["sh", "-c", look])
        assert "No such file" in other.stderr and other.stdout.strip().endswith("0")
        assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()
        (vc4.shared / marker).write_text("shared")
        assert all(vc4.exec(i, ["cat", str(vc4.shared / marker)]).stdout == "shared" for i in range(4))
        hosts = vc4.exec(3, ["cat", "/etc/hosts"]).stdout
        assert all(f"{vc4.addresses[i]}\t{vc4.name}-{i}" in hosts for i in range(4))
    finally:
        (vc4.shared / marker).unlink(missing_ok=True)


def test_a_cluster_that_is_up_is_refused_and_its_names_carry_its_name(vc4):
    with pytest.raises(tools.VirtualClusterError, match="already up"):
        VirtualCluster(vc4.name, nodes=2).up()
    held = _ours(vc4.name)
    assert len(held["netns"]) == 5 and f"wbv-{vc4.name}-launch" in held["netns"]  # the nodes' and the launcher's
    assert {f"wbv{vc4.name}-br", f"wbv{vc4.name}-L"} <= set(held["links"]) and held["folder"]


def test_down_removes_everything_and_a_dead_owners_cluster_goes_with_the_next_up(tmp_path):
    name = vcluster_name("d")
    code = f"""
import os
from workbench.vcluster import VirtualCluster
vc = VirtualCluster({name!r}, nodes=3, topology="ring", shared={str(tmp_path)!r})
vc.up()
os._exit(0)  # a kernel that dies: the cluster stays, its owner is gone
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert len(_ours(name)["netns"]) == 4  # 3 nodes and the launcher network
    listed = subprocess.run([sys.executable, "-m", "workbench.cli", "vcluster", "list"], capture_output=True, text=True,
                            timeout=60).stdout
    line = next(line for line in listed.splitlines() if line.startswith(name))
    assert "owner (pid" in line and f"gone: `workbench vcluster down {name}`" in line, listed
    # a crashed `up` of another name left a namespace and a bridge without any record
    other = vcluster_name("e")
    subprocess.run(["ip", "netns", "add", f"wbv-{other}-0"], check=True)
    subprocess.run(["ip", "link", "add", "name", f"wbv{other}-br", "type", "bridge"], check=True)
    fresh = start(VirtualCluster(other, nodes=2, shared=tmp_path / "other"))
    try:
        assert _ours(name) == {"netns": [], "links": [], "mounts": [], "folder": False}  # stale: removed
        assert len(_ours(other)["netns"]) == 3  # 2 nodes and the launcher network
    finally:
        fresh.down()
    assert _ours(other) == {"netns": [], "links": [], "mounts": [], "folder": False}
    assert (tmp_path / "other").is_dir()  # the shared folder stays: runs live there


# -- links and MPI ----------------------------------------------------------------------------
def test_mpi_across_the_nodes_crosses_the_shaped_links(vc4):
    before = _sent(vc4)
    program = _program(vc4, "allreduce.py", ALLREDUCE)
    result = run_mpi(4, [program], timeout=120, cwd=ROOT, **vc4.run_options(4))
    hosts = sorted(line.split()[2] for line in result.output.splitlines() if line.startswith("host "))
    assert hosts == [f"{vc4.name}-{i}" for i in range(4)]
    after = _sent(vc4)
    ring = 2 * 3 / 4 * (4 << 20)  # bytes each node sends in a ring all-reduce of 4 MiB
    for i in range(4):  # what node i sent crossed its own port, then the receiver's
        assert after[(i, "eth0")] - before[(i, "eth0")] >= ring, (i, after, before)
        assert after[(None, vc4.plan.host_end(i))] - before[(None, vc4.plan.host_end(i))] >= ring


def _listening(net_tcp: list[str]) -> set[int]:
    """The inodes of the listening TCP sockets in ``/proc/.../net/tcp`` and ``tcp6`` files."""
    found = set()
    for path in net_tcp:
        for line in Path(path).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found.add(int(fields[9]))
    return found


def _sockets_of(pid: int) -> set[int]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}") if os.path.exists(f"/proc/{pid}/fd/{fd}") else ""
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def test_the_heads_mpiexec_listens_on_the_cluster_network_alone(vc4, tmp_path):
    """hydra listens for its proxies on every address it has, without authentication (issue 45): the head's
    mpiexec runs in the cluster's launcher network, whose one cable goes to the bridge, so its port is on
    none of the host's own addresses."""
    import psutil
    from workbench.runtime.launch.launcher import batch_launcher
    options = vc4.run_options(2, job_dir=Path(vc4.shared) / "jobs")
    assert options["network"], "the cluster has a launcher network"
    backend = batch_launcher("mpiexec", 2, ["-c", "import time; time.sleep(6)"], cwd=ROOT, **options)
    backend.start()
    try:
        launchers = ("mpiexec", "prterun")

        def head():  # this job's launcher itself: not a child it forked to start a node's proxy (named as it is),
            # nor another test's (a notebook cluster's engines run under an mpiexec of this process too)
            for p in psutil.Process().children(recursive=True):
                try:
                    if (p.name().startswith(launchers) and not p.parent().name().startswith(launchers)
                            and "time.sleep(6)" in " ".join(p.cmdline())):
                        return p
                except psutil.Error:
                    continue
            return None

        deadline, hydra = time.monotonic() + 30, None
        while hydra is None and time.monotonic() < deadline:
            hydra = head()
            time.sleep(0.2)
        assert hydra is not None, "no mpiexec started"
        time.sleep(1.5)  # its proxies connected: it listens by now
        assert head() is not None and head().pid == hydra.pid, "mpiexec ended before it could be looked at"
        launcher_net = os.stat(f"/var/run/netns/wbv-{vc4.name}-launch").st_ino
        assert os.stat(f"/proc/{hydra.pid}/ns/net").st_ino == launcher_net
        mine = _sockets_of(hydra.pid)
        inside = _listening([f"/proc/{hydra.pid}/net/tcp", f"/proc/{hydra.pid}/net/tcp6"]) & mine
        on_host = _listening(["/proc/self/net/tcp", "/proc/self/net/tcp6"]) & mine
        assert inside and not on_host, (inside, on_host)  # it listens, and not in the host's network
    finally:
        backend.wait(60, None, 5)
        backend.stop(immediate=True)


def test_even_mpichs_default_transport_crosses_the_links(vc4):
    """Nothing passes between nodes but the network: MPICH's default transport (UCX) uses shared memory
    between processes that share /dev/shm and SysV IPC, and each node has its own of both, so even
    without MPI_ENV every byte of an all-reduce between two nodes crosses their links."""
    before = _sent(vc4)
    program = _program(vc4, "allreduce.py", ALLREDUCE)
    options = vc4.run_options(2)
    options["env"] = {"WORKBENCH_VCLUSTER": vc4.name}  # MPICH's own choice of transport
    run_mpi(2, [program], timeout=120, cwd=ROOT, **options)
    after = _sent(vc4)
    for i in range(2):
        assert after[(i, "eth0")] - before[(i, "eth0")] >= 4 << 20  # a 2-rank ring sends everything once


INCAST = """
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 0:   # 1 MiB from every other rank at once
    buffers = [np.empty(1 << 18, dtype=np.float32) for _ in range(1, comm.size)]
    MPI.Request.Waitall([comm.Irecv(b, source=r) for r, b in enumerate(buffers, 1)])
    assert all(b[0] == r for r, b in enumerate(buffers, 1))
else:
    comm.Send(np.full(1 << 18, comm.rank, dtype=np.float32), dest=0)
"""


def test_shallow_queues_drop_packets_and_the_drops_are_counted_per_link(tmp_path):
    # two nodes send 1 MiB each to a third at once through 8 KiB queues: the senders' uplinks and
    # the receiver's port overflow (each drop a TCP retransmission; the original EASGD's master meets
    # this at its port); the status counts them on the links that carried the data, and only there
    vc = start(VirtualCluster(vcluster_name("q"), nodes=3, topology="switch", bandwidth="100mbit", queue="8K",
                              shared=tmp_path))
    try:
        assert vc.drops() == {}
        run_mpi(3, [_program(vc, "incast.py", INCAST)], timeout=120, cwd=ROOT, **vc.run_options(3))
        drops = vc.drops()
        data_path = {(1, "eth0"), (2, "eth0"), (None, vc.plan.host_end(0))}
        assert sum(drops.values()) > 0 and set(drops) <= data_path, drops
        links = {(link["node"], link["device"]): link["drops"] for link in vc.status()["links"]}
        assert {k: v for k, v in links.items() if v} == drops
        shown = subprocess.run([*WORKBENCH, "vcluster", "status", vc.name], capture_output=True, text=True, timeout=60)
        assert "drops (queue full)" in shown.stdout, shown.stdout + shown.stderr
    finally:
        vc.down()


def test_a_ring_forwards_through_the_nodes_between(tmp_path):
    vc = start(VirtualCluster(vcluster_name("r"), nodes=4, topology="ring", bandwidth="1gbit", shared=tmp_path))
    try:
        before = _sent(vc)
        server = subprocess.Popen([*vc.enter(2), sys.executable, "-c",
                                   "import socket; s=socket.socket(); s.bind(('0.0.0.0', 5999)); s.listen(); "
                                   "c,_=s.accept(); n=0\nwhile (d:=c.recv(1<<16)): n+=len(d)\nprint(n)"],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        client = vc.exec(0, [sys.executable, "-c", f"import socket; c=socket.create_connection(('{vc.addresses[2]}', "
                                                  "5999)); c.sendall(b'x' * (2 << 20)); c.close()"])
        assert client.returncode == 0, client.stderr
        assert int(server.communicate(timeout=30)[0]) == 2 << 20
        after = _sent(vc)
        delta = {k: after[k] - before[k] for k in after}
        # 0 -> 2 on ring:4 goes 0 -> 1 -> 2 (the topology's route): node 1 forwards it
        assert vc.plan.topo.route(0, 2) == ((0, 1), (1, 2))
        assert delta[(0, "to1")] >= 2 << 20 and delta[(1, "to2")] >= 2 << 20
        assert delta[(0, "to3")] < 64 << 10 and delta[(3, "to2")] < 64 << 10  # the other way round stays idle
    finally:
        vc.down()


# -- the command-line contract ------------------------------------------------------------------
def test_the_cli_contract(tmp_path):
    name = vcluster_name("c")
    env = {**os.environ, "WORKBENCH_STATE_DIR": str(tmp_path)}

    def cli(*args, check=True, timeout=120):
        proc = subprocess.run([*WORKBENCH, "vcluster", *args], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=ROOT)
        assert not check or proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc

    up = cli("up", name, "--nodes", "2", "--topology", "ring", "--bandwidth", "200mbit")
    try:
        assert f"vcluster {name} up" in up.stdout
        status = json.loads(cli("status", name, "--json").stdout)
        assert [n["hostname"] for n in status["nodes"]] == [f"{name}-0", f"{name}-1"]
        assert {link["rate"] for link in status["links"]} == {"200mbit"} and len(status["links"]) == 2
        assert cli("exec", name, "--node", "1", "--", "hostname").stdout.strip() == f"{name}-1"
        hello = cli("mpiexec", name, "-n", "4", "--ppn", "2", "--", sys.executable, "-c",
                    "from mpi4py import MPI; import os, socket; "
                    "os.write(1, f'rank {MPI.COMM_WORLD.rank} {socket.gethostname()}\\n'.encode())")
        placed = sorted(re.findall(rf"rank (\d+) ({name}-\d)", hello.stdout))  # ranks' lines may interleave
        assert placed == [("0", f"{name}-0"), ("1", f"{name}-0"), ("2", f"{name}-1"), ("3", f"{name}-1")], hello.stdout
        after = json.loads(cli("status", name, "--json").stdout)
        assert sum(link["bytes_sent"] for link in after["links"]) > sum(link["bytes_sent"] for link in status["links"])
        assert cli("env", name).stdout.startswith(f"export WORKBENCH_VCLUSTER={name}")
        bad = cli("exec", name, "--node", "7", "--", "true", check=False)
        assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "node: must be 0..1" in bad.stderr
        again = cli("up", name, "--nodes", "2", check=False)
        assert again.returncode == 1 and "already up" in again.stderr
    finally:
        down = cli("down", name)
    assert f"vcluster {name} down" in down.stdout
    assert _ours(name) == {"netns": [], "links": [], "mounts": [], "folder": False}
    assert "was not up" in cli("down", name).stdout


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "--nodes: must be an integer >= 1"),
    (["--nodes", "4", "--topology", "torus:3x3"], "topology: torus:3x3 has 9 nodes"),
    (["--nodes", "2", "--bandwidth", "fast"], "bandwidth: 'fast' is not a rate"),
    (["--nodes", "2", "--latency", "1ms"], "latency: this kernel has no netem"),
])
def test_bad_input_is_one_line_and_leaves_nothing(args, message, tmp_path):
    name = vcluster_name("b")
    proc = subprocess.run([*WORKBENCH, "vcluster", "up", name, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "WORKBENCH_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]  # (argparse shows its usage first)
    assert len(errors) == 1 and message in errors[0]
    assert _ours(name) == {"netns": [], "links": [], "mounts": [], "folder": False}


# -- training from the CLI ----------------------------------------------------------------------
def test_workbench_train_on_the_virtual_cluster(vc4, tmp_path):
    out = vc4.shared / "cli-train"
    store = tmp_path / "store.sqlite"
    before = sum(_sent(vc4).values())
    proc = subprocess.run([*WORKBENCH, "train", "--algorithm", "sync-sgd", "--ranks", "4", "--ppn", "2", "--epochs",
                           "2", "--vcluster", vc4.name, "--out", str(out), "--store", str(store),
                           "--checkpoint-every", "10", "--collective", "ring"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"4 ranks on 2 of its 4 nodes, 2 per node" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 4 and summary["final_test_accuracy"] > 0.5
    # ranks 0,1 on node 0 and 2,3 on node 1: half the ring's sends (1 -> 2, 3 -> 0) cross, each counted at
    # the sender's port and the receiver's
    assert sum(_sent(vc4).values()) - before >= 0.95 * summary["bytes_sent"]
    assert not (out / "job").exists()  # the job's own folder went with it
    resumed = subprocess.run([*WORKBENCH, "train", "--algorithm", "sync-sgd", "--ranks", "4", "--ppn", "2", "--epochs",
                              "3", "--vcluster", vc4.name, "--out", str(vc4.shared / "cli-resumed"), "--collective", "ring", "--store",
                              str(store), "--resume", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed_from" in resumed.stdout
    hidden = subprocess.run([*WORKBENCH, "train", "--algorithm", "sync-sgd", "--ranks", "4", "--ppn", "2",
                             "--vcluster", vc4.name, "--out", str(tmp_path / "run"), "--store", str(store)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert hidden.returncode == 2 and "--out: " in hidden.stderr and "not seen by the nodes" in hidden.stderr
    too_many = subprocess.run([*WORKBENCH, "train", "--algorithm", "sync-sgd", "--ranks", "8", "--vcluster", vc4.name,
                               "--store", str(store)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert too_many.returncode == 2 and "--vcluster: ppn: 8 ranks at 1 per node need 8 nodes" in too_many.stderr


# -- faults -----------------------------------------------------------------------------------
def _fault_during(vc, fault, nranks: int = 4, ppn: int = 1) -> tuple[str, float]:
    """Run FOREVER on the nodes, apply ``fault`` 3 s in; the launch error and the seconds from the fault to it."""
    program = _program(vc, "forever.py", FOREVER)
    when = {}

    def later():
        time.sleep(3)
        when["fault"] = time.monotonic()
        fault()

    threading.Thread(target=later, daemon=True).start()
    with pytest.raises(MPILaunchError) as info:
        run_mpi(nranks, [program], timeout=150, cwd=ROOT, **vc.run_options(nranks, ppn))
    return str(info.value), time.monotonic() - when["fault"]


def _next_job_runs(vc):
    program = _program(vc, "allreduce.py", ALLREDUCE)
    result = run_mpi(4, [program], timeout=120, cwd=ROOT, **vc.run_options(4))
    assert len([line for line in result.output.splitlines() if line.startswith("host ")]) == 4


PROBE = """import socket, sys
s = socket.socket()
s.settimeout(2)
try:
    s.connect((sys.argv[1], 9))
    print("open")
except ConnectionRefusedError:
    print("reachable")   # the node answered: nothing listens on port 9
except OSError:
    print("unreachable")
"""


def _reach(vc, src: int, dst: int) -> str:
    return vc.exec(src, [sys.executable, "-c", PROBE, vc.addresses[dst]], timeout=30).stdout.strip()


def test_faults_as_a_user_types_them_kill_partition_heal_restore(vc4):
    """Issue 46's nemesis: each fault from the shell, one line each, and what it does to the node."""
    cli, node = [sys.executable, "-m", "workbench.cli", "vcluster"], 3

    def fault(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)

    keep = Path(vc4.shared) / "wbfault-kept"
    keep.write_text("shared")
    sleeper = subprocess.Popen([*vc4.enter(node), "sleep", "300"])
    try:
        vc4.exec(node, ["sh", "-c", "echo x > /tmp/wbfault-mark; echo y > /dev/shm/wbfault-mark"], check=True)
        deadline = time.monotonic() + 10
        while sleeper.pid not in vc4.processes(node) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = fault("kill", vc4.name, "--node", str(node))
        assert killed.returncode == 0 and re.fullmatch(rf"vcluster {vc4.name}: node 3 \({vc4.hostnames[3]}\) killed: "
                                                       r"[1-9]\d* processes\n", killed.stdout), killed
        assert sleeper.wait(10) == -9 and vc4.processes(node) == []
        assert vc4.exec(node, ["cat", "/tmp/wbfault-mark"]).stdout == "x\n"  # a crash leaves the node's files
        assert _reach(vc4, 0, node) == "reachable"
        cut = fault("partition", vc4.name, "--node", str(node))
        assert cut.returncode == 0 and "cut off" in cut.stdout, cut
        assert _reach(vc4, 0, node) == "unreachable" and _reach(vc4, node, 1) == "unreachable"
        healed = fault("heal", vc4.name, "--node", str(node))
        assert healed.returncode == 0 and _reach(vc4, 0, node) == "reachable", healed
        fault("partition", vc4.name, "--node", str(node))
        restored = fault("restore", vc4.name, "--node", str(node))
        assert restored.returncode == 0 and "restored, empty" in restored.stdout, restored
        assert vc4.exec(node, ["ls", "/tmp", "/dev/shm"]).stdout.count("wbfault-mark") == 0
        assert keep.read_text() == "shared" and _reach(vc4, 0, node) == "reachable"
        assert vc4.answering() == [0, 1, 2, 3]
        crashed = fault("kill", vc4.name, "--node", str(node), "--down")
        assert crashed.returncode == 0 and f"its links are down until `workbench vcluster restore {vc4.name} --node 3`" \
            in crashed.stdout, crashed
        assert vc4.answering() == [0, 1, 2] and _reach(vc4, 0, node) == "unreachable"
        fault("restore", vc4.name, "--node", str(node))
        assert vc4.answering() == [0, 1, 2, 3]
        bad = fault("kill", vc4.name, "--node", "9")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "node: must be 0..3" in bad.stderr, bad
    finally:
        sleeper.kill()
        vc4.heal(node)
        keep.unlink(missing_ok=True)


def test_a_partition_is_named_within_a_minute_and_the_cluster_runs_the_next_job(vc4):
    try:
        message, seconds = _fault_during(vc4, lambda: vc4.set_link(2, False))
        first = message.splitlines()[0]
        assert first.startswith(f"node {vc4.name}-2 stopped answering") and f"rank 2 on node {vc4.name}-2" in first
        assert seconds < 60
        assert _nothing_runs(vc4) == []
    finally:
        vc4.set_link(2, True)
    _next_job_runs(vc4)


def test_a_nodes_processes_killed_are_named_with_rank_and_node(vc4):
    message, seconds = _fault_during(vc4, lambda: vc4.kill_node(3), nranks=8, ppn=2)
    first = message.splitlines()[0]
    assert (first.startswith(f"rank 6 on node {vc4.name}-3") or first.startswith(f"rank 7 on node {vc4.name}-3")), first
    assert "vanished with its guard" in first and "on the same node went too" in first and seconds < 60
    assert _nothing_runs(vc4) == []
    _next_job_runs(vc4)


def _train_killing(vc, run_dir: Path, store: Path, node: int, *args: str, algorithm: str = "sync-sgd",
                   down: bool = True) -> tuple[subprocess.CompletedProcess, float]:
    """`workbench train` of ``algorithm`` on 4 ranks of ``vc`` with ``args``; node ``node`` crashed once rank 2
    has passed step 60 (``down``: for good, until restored). The finished CLI and when the node went."""
    cli = subprocess.Popen([*WORKBENCH, "train", "--algorithm", algorithm, "--ranks", "4", "--vcluster", vc.name,
                            "--epochs", "60", "--checkpoint-every", "50", "--out", str(run_dir), "--store", str(store),
                            "--no-progress", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        live, deadline = run_dir / "live" / "rank2.jsonl", time.monotonic() + 180
        while time.monotonic() < deadline and cli.poll() is None and not (
                live.exists() and any(r.get("step", 0) >= 60 for line in live.read_text().splitlines()
                                      for r in json.loads(line).get("metrics", ()))):
            time.sleep(0.1)
        assert cli.poll() is None, "the run ended before the fault"
        assert vc.kill_node(node, down=down), f"nothing ran on node {node}"
        killed = time.time()
        out, err = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
    return subprocess.CompletedProcess(cli.args, cli.returncode, out, err), killed


def test_a_run_goes_on_at_fewer_ranks_without_a_crashed_node_with_min_ranks(vc4, tmp_path):
    """Issue 46: a node crashes for good mid-run (its processes killed, its links down until restored). With
    `--min-ranks 3` the run starts again from its checkpoint on the 3 nodes that answer, deals the data to 3
    ranks, takes the steps it planned, and finishes as one run naming the fault and each size; without
    --min-ranks it fails, saying why it did not restart; nothing is left on any node."""
    store = tmp_path / "store.sqlite"
    try:
        run_dir = Path(vc4.shared) / f"shrink-{os.getpid()}"
        done, killed = _train_killing(vc4, run_dir, store, 2, "--max-restarts", "1", "--min-ranks", "3")
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        [fault] = summary["restarts"]
        assert summary["world_sizes"] == [4, 3] and summary["incarnations"] == 2, summary
        assert fault["nodes_lost"] == [f"{vc4.name}-2"] and fault["world_size"] == 3 and fault["rank"] == 2, fault
        assert 0 < fault["recovery_seconds"] < 120 and fault["detected"] > killed, fault
        from workbench.runtime.launch import heartbeat
        assert fault["detected"] - killed < heartbeat.TIMEOUT, fault  # $WORKBENCH_HEARTBEAT_TIMEOUT (5 s) applied
        assert f"on 3 ranks ({vc4.name}-2 left out: not answering)" in done.stderr
        assert "it goes on at 3 ranks (4 before): the same steps" in done.stderr
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = sorted(r["step"] for r in records if r.get("kind") == "train" and r["rank"] == 0)
        planned = json.loads((run_dir / "config.json").read_text())
        assert planned["ranks"] == 4 and planned["min_ranks"] == 3  # the run as asked for
        from workbench import data
        from workbench.config import RunConfig
        from workbench.summary import planned_steps
        cfg = RunConfig.from_dict(planned)
        at_four = planned_steps(data.describe(cfg.dataset, **cfg.data_sizes).train_samples, 4, cfg.batch_size,
                                cfg.epochs, True)[0]
        assert steps == list(range(at_four)) and summary["steps_per_worker"] == at_four, (len(steps), at_four, summary)
        # rank 3 of the first incarnation trained up to the checkpoint; no rank 3 after it
        last3 = max(r["step"] for r in records if r.get("kind") == "train" and r["rank"] == 3)
        assert last3 < fault["resumed_from_step"] and summary["final_test_accuracy"] > 0.5, summary
        assert _nothing_runs(vc4) == []
        vc4.restore(2)
        again = Path(vc4.shared) / f"noshrink-{os.getpid()}"
        failed, _ = _train_killing(vc4, again, store, 1, "--max-restarts", "1")
        assert failed.returncode != 0 and f"no restart: {vc4.name}-1 do not answer, and the 3 nodes left hold 3 ranks, " \
            "fewer than the run's 4; --min-ranks M lets it go on with fewer" in failed.stderr, failed.stderr[-3000:]
        assert _nothing_runs(vc4) == []
    finally:
        for node in (1, 2):
            vc4.restore(node)


def test_a_nodes_launcher_process_killed_ends_its_ranks_and_is_named(vc4):
    """Hydra's proxy on node 2 killed while its rank lives: the rank's guard ends the rank, and the
    job fails naming the node and the process, instead of running on to its timeout."""
    import psutil

    def kill_proxy():
        deadline = time.monotonic() + 60  # a loaded machine may not have started node 2's proxy 3 s in
        while time.monotonic() < deadline:
            killed = False
            for pid in vc4.processes(2):
                try:  # the proxy itself, not the standin's `sh -c` that started it
                    if psutil.Process(pid).name() == "hydra_pmi_proxy":
                        os.kill(pid, 9)
                        killed = True
                except (psutil.NoSuchProcess, ProcessLookupError):
                    pass
            if killed:
                return
            time.sleep(0.2)

    message, seconds = _fault_during(vc4, kill_proxy)
    first = message.splitlines()[0]
    assert first.startswith(f"the launcher's process on node {vc4.name}-2 (pid "), first
    assert "died while its ranks ran: rank 2 ended by their guards" in first and seconds < 60, (first, seconds)
    assert _nothing_runs(vc4) == []
    _next_job_runs(vc4)


#: torch.distributed (gloo) across the nodes, meeting where torch_init_method says
GLOO = """
import socket
import torch
import torch.distributed as dist
from mpi4py import MPI
from workbench.ports import torch_init_method
comm = MPI.COMM_WORLD
where = torch_init_method(comm)
dist.init_process_group("gloo", init_method=where, rank=comm.rank, world_size=comm.size)
t = torch.full((1 << 20,), float(comm.rank))
dist.all_reduce(t)
assert t[0] == sum(range(comm.size)), t[0]
print("gloo", comm.rank, socket.gethostname(), where, flush=True)
dist.destroy_process_group()
"""


def test_torch_distributed_meets_at_rank_0s_node_and_crosses_the_links(tmp_path):
    """DDP's gloo on the nodes (benchmarks/gradient_comm_vcluster.py): the ranks meet at node 0's own
    address (127.0.0.1 is each node's own) and the all-reduce's 4 MiB cross the shaped links."""
    vc = start(VirtualCluster(vcluster_name("g"), nodes=2, topology="switch", bandwidth="1gbit", shared=tmp_path))
    try:
        before = _sent(vc)
        result = run_mpi(2, [_program(vc, "gloo.py", GLOO)], timeout=180, cwd=ROOT, **vc.run_options(2))
        lines = sorted(line.split() for line in result.output.splitlines() if line.startswith("gloo "))
        assert [line[2] for line in lines] == [f"{vc.name}-0", f"{vc.name}-1"]
        assert all(line[3].startswith(f"tcp://{vc.addresses[0]}:") for line in lines), lines
        after = _sent(vc)
        for i in range(2):  # a 2-rank ring: each node sends its whole 4 MiB once
            assert after[(i, "eth0")] - before[(i, "eth0")] >= 4 << 20
    finally:
        vc.down()
