"""A :class:`~workbench.vcluster.plan.Plan` made real: namespaces, cables, shaping, routes; and undone.

Needs root (or a user namespace where the process is root: :mod:`.rootless`). Every step is a
batch of ``ip`` / ``tc`` commands or one short shell per node, so 4 nodes come up in a fraction
of a second. What a node is:

- a network namespace ``wbv-NAME-I`` (``ip netns``), with ``eth0`` to the bridge and, on direct
  topologies, one ``to<J>`` cable per neighbour; forwarding on, reverse-path filtering off (routes
  along a torus are not symmetric), IPv6 off (no link-local chatter on the data cables), TCP's
  slow start after idle off (as HPC nodes are tuned: a gap between two messages does not shrink
  the window);
- UTS, IPC and mount namespaces kept as files under the cluster's folder (no process holds
  them): its own hostname ``NAME-I``, its own SysV IPC, an empty ``/tmp`` and ``/dev/shm``, an
  ``/etc/hosts`` that names every node and the head. The rest of the file system is the host's
  (as software and home directories are shared on a real cluster); the cluster's shared folder,
  and the software that runs there when it lies under ``/tmp``, are mounted at their own paths.

The process table is the host's (no PID namespace): the head sees every node's processes, which
is how ``down`` and the tests find what runs on a node (by its network namespace).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..runtime.processes import stop_processes
from .plan import PREFIX, Plan, PlanError, format_rate
from .registry import folder, read_record, registry
from .tools import VirtualClusterError, ip_batch, run, tc_batch, tool

# -- building ---------------------------------------------------------------------------------
def ns_file(plan: Plan, node: int | str, kind: str) -> Path:
    """The file that keeps node ``node``'s (or ``"head"``'s) namespace of ``kind`` (uts, ipc, mnt)."""
    return folder(plan.name) / "ns" / f"{node}.{kind}"


def netns_path(plan: Plan, node: int | None) -> str:
    """The file of node ``node``'s network namespace (None: the head's launcher network)."""
    return f"/var/run/netns/{plan.netns(node) if node is not None else plan.launcher_netns}"


def burst_bytes(bandwidth: int) -> int:
    """The shaper's bucket (HTB ``burst`` and ``cburst``) on a link of ``bandwidth`` bit/s, in bytes
    on the wire: 2 ms at the rate, at least 64 KiB (a segment that veth hands over whole must fit).
    A link idle for ``burst / rate`` sends that many bytes at once: the predictor's
    ``AlphaBeta.burst`` (``netsim.costs.tcp_link(..., burst_bytes=...)``)."""
    return max(64 << 10, bandwidth // 8 * 2 // 1000)


def _shaping(plan: Plan, device: str) -> list[str]:
    """tc lines that shape ``device``'s egress to the plan's rate (HTB; netem under it for latency),
    with a bucket of :func:`burst_bytes`."""
    rate = format_rate(plan.bandwidth)
    burst = burst_bytes(plan.bandwidth)
    lines = [f"qdisc replace dev {device} root handle 1: htb default 1",
             f"class add dev {device} parent 1: classid 1:1 htb rate {rate} ceil {rate} burst {burst} "
             f"cburst {burst} quantum 60000"]
    if plan.latency:
        lines.append(f"qdisc add dev {device} parent 1:1 handle 10: netem delay {plan.latency * 1e6:.0f}us "
                     "limit 100000")
    else:
        lines.append(f"qdisc add dev {device} parent 1:1 handle 10: bfifo limit {queue_bytes(plan)}")
    return lines


#: the default queue behind each shaper (a switch port's buffer), in bytes: QUEUE_SECONDS at the
#: link's rate, at least QUEUE_MIN_BYTES. Measured at 100 Mbit/s, 4 nodes: the kernel's default
#: 1000-packet FIFO holds 120 ms and stretches every round trip by as much (this kernel has no
#: fq_codel); with 128 KiB a ring all-reduce of 8 MiB reaches 0.95 of the bound, but when two
#: children send to one parent at once (binary trees) packets drop (55-160 per port), each a TCP
#: retransmission timeout (1 MiB trees 3-4x slower than the simulator); with 256 KiB-1 MiB nothing
#: drops and the trees come within 2-10% of it, but the ring falls to 0.77-0.80: MPI's control
#: messages wait behind the queued data. `--queue` chooses per cluster.
QUEUE_SECONDS = 0.005
QUEUE_MIN_BYTES = 128 << 10


def queue_bytes(plan: Plan) -> int:
    """Bytes each of the plan's links may queue."""
    return plan.queue or max(QUEUE_MIN_BYTES, int(plan.bandwidth / 8 * QUEUE_SECONDS))


def check_latency_supported(plan: Plan) -> None:
    """``--latency`` needs the netem qdisc: a one-line PlanError where this kernel lacks it."""
    if not plan.latency:
        return
    probe = plan.netns(0)
    proc = run([tool("tc"), "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
               "probe netem", check=False)
    run([tool("tc"), "-n", probe, "qdisc", "del", "dev", "lo", "root"], "probe netem", check=False)
    if proc.returncode != 0:
        said = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise PlanError(f"latency: this kernel has no netem qdisc (tc: {said}), so no latency can be added; "
                        "leave --latency out: a link's latency is then the kernel's own (tens of microseconds)")


def _node_setup_script(plan: Plan, node: int | None, exposed: list[str]) -> str:
    """The shell that makes a node's (or, ``None``, the head's Slurm) UTS, IPC and mount namespaces
    what they should be; it runs inside them (and in the node's network namespace)."""
    base = folder(plan.name)
    lines = ["set -e", f"hostname {plan.hostname(node) if node is not None else plan.head_hostname}",
             f"mount --bind {base / 'hosts'} /etc/hosts"]
    if node is not None:
        stash = base / "stash"
        lines += [f"mount --rbind /tmp {stash}/tmp", f"mount --rbind /dev/shm {stash}/shm",
                  "mount -t tmpfs -o mode=1777,size=50% wbvtmp /tmp",
                  "mount -t tmpfs -o mode=1777,size=50% wbvshm /dev/shm"]
        for path in exposed:  # the shared folder and software under /tmp or /dev/shm, at their own paths
            for top, where in (("/tmp", "tmp"), ("/dev/shm", "shm")):
                if path == top or path.startswith(top + "/"):
                    source = f"{stash}/{where}{path[len(top):]}"
                    lines += [f"mkdir -p '{path}'", f"mount --rbind '{source}' '{path}'"]
        lines += [f"umount -l {stash}/tmp", f"umount -l {stash}/shm",
                  "echo 1 > /proc/sys/net/ipv4/ip_forward",
                  "for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done",
                  "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6",
                  "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6",
                  "echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle"]
    # other clusters' and nodes' kept namespaces are mounted under the registry: not this one's business
    lines.append(f"umount -l {registry()} 2>/dev/null || true")
    return "\n".join(lines)


def exposed_paths(plan: Plan) -> list[str]:
    """Host paths a node must see at the same place although they lie under ``/tmp`` or
    ``/dev/shm``: the shared folder, this Python's environment and the workbench package."""
    import workbench
    candidates = [plan.shared, sys.prefix, sys.base_prefix, str(Path(workbench.__file__).resolve().parents[1])]
    out = []
    for path in candidates:
        real = os.path.realpath(path) if path else ""
        if real and any(real == top or real.startswith(top + "/") for top in ("/tmp", "/dev/shm")):
            out.append(real)
    return sorted(set(out), key=len)


def _launcher_cable(plan: Plan) -> list[str]:
    """``ip`` commands on the host for the head's launcher network: its namespace and its one cable to the
    bridge. What the launchers listen on there (hydra's control port, on every address it has) is on the
    cluster network, not on the host's own addresses."""
    end = plan.launcher_end
    return [f"netns add {plan.launcher_netns}", f"link add name {end} type veth peer name eth0 netns {plan.launcher_netns}",
            f"link set dev {end} addrgenmode none", f"link set dev {end} master {plan.bridge}", f"link set dev {end} up"]


def build(plan: Plan) -> None:
    """Create everything the plan names (nothing of it may exist yet)."""
    base = folder(plan.name)
    for sub in ("ns", "stash/tmp", "stash/shm", "bin"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "hosts").write_text(plan.hosts_file())
    _keep_mounts_private(registry())

    br, sub = plan.bridge, plan.subnet
    host = [f"link add name {br} type bridge", f"link set dev {br} addrgenmode none",
            f"addr add {plan.head_address}/{sub.prefixlen} dev {br}", f"link set dev {br} up"]
    for i in range(plan.nodes):
        host += [f"netns add {plan.netns(i)}",
                 f"link add name {plan.host_end(i)} type veth peer name eth0 netns {plan.netns(i)}",
                 f"link set dev {plan.host_end(i)} addrgenmode none",
                 f"link set dev {plan.host_end(i)} master {br}", f"link set dev {plan.host_end(i)} up"]
    host += _launcher_cable(plan)
    for cable in plan.cables:
        host.append(f"link add name {cable.device(cable.a)} netns {plan.netns(cable.a)} type veth "
                    f"peer name {cable.device(cable.b)} netns {plan.netns(cable.b)}")
    ip_batch(host, f"vcluster {plan.name}: create the bridge, namespaces and cables")
    check_latency_supported(plan)
    ip_batch(["link set dev lo up", f"addr add {plan.launcher_address}/{sub.prefixlen} dev eth0", "link set dev eth0 up"],
             f"vcluster {plan.name}: address the launcher network", netns=plan.launcher_netns)

    exposed = exposed_paths(plan)
    setups = []
    for i in range(plan.nodes):
        node = [f"link set dev lo up", f"addr add {plan.address(i)}/{sub.prefixlen} dev eth0", "link set dev eth0 up"]
        node += [f"link set dev {c.device(i)} up" for c in plan.cables if i in (c.a, c.b)]
        node += [f"route add {r.dst}/32 via {r.via} dev {r.device} onlink src {plan.address(i)}"
                 for r in plan.routes(i)]
        ip_batch(node, f"vcluster {plan.name}: address node {i}", netns=plan.netns(i))
        for kind in ("uts", "ipc", "mnt"):
            ns_file(plan, i, kind).touch()
        setups.append(subprocess.Popen(
            [tool("nsenter"), f"--net={netns_path(plan, i)}", tool("unshare"), f"--uts={ns_file(plan, i, 'uts')}",
             f"--ipc={ns_file(plan, i, 'ipc')}", f"--mount={ns_file(plan, i, 'mnt')}", "--propagation", "private",
             "sh", "-c", _node_setup_script(plan, i, exposed)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    if plan.slurm:
        for kind in ("uts", "mnt"):
            ns_file(plan, "head", kind).touch()
        setups.append(subprocess.Popen(
            [tool("unshare"), f"--uts={ns_file(plan, 'head', 'uts')}", f"--mount={ns_file(plan, 'head', 'mnt')}",
             "--propagation", "slave", "sh", "-c", _node_setup_script(plan, None, [])],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    host_shaping = []
    for node, device in plan.shaped_links():
        if node is None:
            host_shaping += _shaping(plan, device)
        else:
            tc_batch(_shaping(plan, device), f"vcluster {plan.name}: shape {device} of node {node}", plan.netns(node))
    tc_batch(host_shaping, f"vcluster {plan.name}: shape the bridge's ports")
    for i, proc in enumerate(setups):
        out, _ = proc.communicate(timeout=60)
        if proc.returncode != 0:
            who = f"node {i}" if i < plan.nodes else "the head's Slurm namespace"
            raise VirtualClusterError(f"vcluster {plan.name}: setting up {who} failed: {' '.join(out.split())[:400]}")


def _keep_mounts_private(path: Path) -> None:
    """Kept mount namespaces must live on a private mount (the kernel refuses them elsewhere): make
    ``path`` one, binding it onto itself only when it is not a mount yet (``--make-private`` fails on
    a plain folder; a second bind stacked on the first would hide the namespaces kept below it)."""
    if run(["mount", "--make-private", str(path)], f"make {path} private", check=False).returncode != 0:
        run(["mount", "--bind", str(path), str(path)], f"bind {path}")
        run(["mount", "--make-private", str(path)], f"make {path} private")


def answers(plan: Plan, timeout: float = 10.0) -> list[str]:
    """What does not answer yet: each node from the head (a TCP connection to a closed port is
    refused at once by a node that is there), and on direct topologies every node from every other
    node through its routes. [] when every node answers."""
    deadline = time.monotonic() + timeout
    missing = list(range(plan.nodes))
    while missing and time.monotonic() < deadline:
        missing = [i for i in missing if not _refused(plan.address(i))]
        if missing:
            time.sleep(0.02)
    problems = [f"node {i} ({plan.address(i)}) does not answer the head" for i in missing]
    if not problems and not plan.switched:
        probe = ("import socket,sys\nbad=[]\nfor a in sys.argv[1:]:\n s=socket.socket(); s.settimeout(2)\n"
                 " try: s.connect((a,9))\n except ConnectionRefusedError: pass\n except OSError: bad.append(a)\n"
                 " finally: s.close()\nprint(' '.join(bad))")
        procs = [(i, subprocess.Popen([tool("nsenter"), f"--net={netns_path(plan, i)}", sys.executable, "-I", "-S",
                                       "-c", probe, *[plan.address(j) for j in range(plan.nodes) if j != i]],
                                      stdout=subprocess.PIPE, text=True)) for i in range(plan.nodes)]
        for i, proc in procs:
            out, _ = proc.communicate(timeout=timeout + 5)
            if out.strip():
                problems.append(f"node {i} cannot reach {out.strip()}")
    return problems


def answering(plan: Plan, timeout: float = 2.0) -> list[int]:
    """The nodes that answer the head now, in order (each asked at once, ``timeout`` s at most)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(32, plan.nodes)) as pool:
        answered = list(pool.map(lambda i: _refused(plan.address(i), timeout), range(plan.nodes)))
    return [i for i, yes in enumerate(answered) if yes]


def _refused(address: str, timeout: float = 0.5) -> bool:
    with socket.socket() as s:
        s.settimeout(timeout)
        try:
            s.connect((address, 9))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        return True


# -- looking at a running cluster -------------------------------------------------------------
def netns_inode(plan: Plan, node: int) -> int | None:
    try:
        return os.stat(netns_path(plan, node)).st_ino
    except OSError:
        return None


def processes_on(plan: Plan, node: int) -> list[int]:
    """Pids of the processes in node ``node``'s network namespace."""
    inode = netns_inode(plan, node)
    return [] if inode is None else _pids_in("net", {inode})


def _pids_in(kind: str, inodes: set[int]) -> list[int]:
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{entry}/ns/{kind}").st_ino in inodes:
                found.append(int(entry))
    return found


def link_counters(plan: Plan) -> list[dict]:
    """Every shaped link: node (None: the host end), device, rate, the bytes its shaper has sent and
    the packets it dropped (its queue full: each a TCP retransmission; the root HTB qdisc's counters,
    ``tc -s qdisc``, which count its queue's drops too)."""
    by_ns: dict = {}
    for node, device in plan.shaped_links():
        by_ns.setdefault(node, []).append(device)
    out = []
    for node, devices in by_ns.items():
        proc = run([tool("tc"), *(["-n", plan.netns(node)] if node is not None else []), "-s", "-j", "qdisc", "show"],
                   "read the link counters", check=False)
        roots = {}   # device -> its root HTB qdisc's counters
        with contextlib.suppress(ValueError):
            roots = {q.get("dev"): q for q in json.loads(proc.stdout or "[]")
                     if q.get("kind") == "htb" and q.get("root")}
        out += [{"node": node, "device": device, "rate": format_rate(plan.bandwidth),
                 "bytes_sent": int(roots.get(device, {}).get("bytes", 0)),
                 "drops": int(roots.get(device, {}).get("drops", 0))} for device in devices]
    return out


# -- removing ---------------------------------------------------------------------------------
def kill_processes(plan: Plan, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process on the cluster's nodes (and in the head's Slurm namespace); wait
    until they are gone. Returns the pids that were killed."""
    inodes = {i for i in (netns_inode(plan, n) for n in range(plan.nodes)) if i}
    pids = _pids_in("net", inodes) if inodes else []
    with contextlib.suppress(OSError):
        head_uts = os.stat(ns_file(plan, "head", "uts")).st_ino
        if head_uts != os.stat("/proc/self/ns/uts").st_ino:
            pids += _pids_in("uts", {head_uts})
    stop_processes(pids, grace=0, kill_wait=timeout)
    return pids


def teardown(name: str) -> list[str]:
    """Remove everything named for cluster ``name`` (recorded or left by a crash): its processes,
    kept namespaces, network namespaces, bridge, host ends and folder. Returns what was removed."""
    removed = []
    record = read_record(name)
    plan = None
    with contextlib.suppress(Exception):
        plan = Plan.from_dict(record) if record else None
    if plan is not None:
        removed += [f"{len(kill_processes(plan))} processes"]
    base = folder(name)
    for path in sorted((base / "ns").glob("*")) if (base / "ns").exists() else []:
        while subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            pass
    netns = [n for n in os.listdir("/var/run/netns") if n.startswith(f"{PREFIX}-{name}-")] \
        if os.path.isdir("/var/run/netns") else []
    if plan is None and netns:  # no record: find its processes by the namespaces' inodes
        inodes = set()
        for n in netns:
            with contextlib.suppress(OSError):
                inodes.add(os.stat(f"/var/run/netns/{n}").st_ino)
        for pid in _pids_in("net", inodes):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    ip_batch([f"netns del {n}" for n in netns], f"vcluster {name}: remove its network namespaces", force=True)
    removed += [f"{len(netns)} network namespaces"]
    links = run([tool("ip"), "-j", "link"], "list links", check=False)
    with contextlib.suppress(ValueError):
        ours = [link["ifname"] for link in json.loads(links.stdout or "[]")
                if link.get("ifname", "").startswith(f"{PREFIX}{name}-")]
        ip_batch([f"link del dev {n}" for n in ours if n.endswith("-br")] +
                 [f"link del dev {n}" for n in ours if not n.endswith("-br")], f"vcluster {name}: remove its links",
                 force=True)
    for stash in ("tmp", "shm"):
        subprocess.run(["umount", "-l", str(base / "stash" / stash)], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)
    return removed


