"""``workbench vcluster``: a virtual cluster of namespaced nodes with shaped links on this machine.

    workbench vcluster up NAME --nodes N [--topology switch|ring|torus:RxC|mesh:RxC|fully_connected]
                          [--bandwidth RATE] [--latency T] [--queue BYTES] [--slurm] [--shared DIR]
    workbench vcluster status NAME [--json]        nodes (hostname, address), links (rate, bytes sent)
    workbench vcluster list                        the clusters that are up
    workbench vcluster exec NAME --node I -- CMD...
    workbench vcluster mpiexec NAME -n R [--ppn K] -- CMD...
    workbench vcluster env NAME                    export lines for the head (SLURM_CONF with --slurm)
    workbench vcluster kill NAME --node I [--down] every process on node I dies at once (a crash; --down:
                                                   its links too, until restore)
    workbench vcluster partition NAME --node I     node I cut off: its links down, its processes run on
    workbench vcluster heal NAME --node I          its links up again
    workbench vcluster restore NAME --node I       node I back, empty (no process, /tmp and /dev/shm emptied)
    workbench vcluster down NAME
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from .common import positive_int, positive_seconds


def add_to(sub) -> None:
    vc = sub.add_parser("vcluster", help="a virtual cluster: nodes as Linux namespaces joined by shaped links",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmds = vc.add_subparsers(dest="vcluster_command", required=True)

    up = cmds.add_parser("up", help="build it; exits 0 once every node answers")
    up.add_argument("name", help="1-8 characters: a lower-case letter, then letters or digits")
    up.add_argument("--nodes", type=positive_int, required=True, help="number of nodes")
    up.add_argument("--topology", default="switch",
                    help="switch (default: every node on one switch), ring, fully_connected, torus:RxC, mesh:RxC")
    up.add_argument("--bandwidth", default="1gbit", metavar="RATE",
                    help="rate of every link, tc's units: 100mbit, 1gbit (default), 25gbit")
    up.add_argument("--latency", default=None, metavar="T",
                    help="added per link (50us, 1ms); needs the kernel's netem qdisc")
    up.add_argument("--queue", default=None, metavar="BYTES",
                    help="bytes each link may queue, like 128K or 1M (default 5 ms at the rate, at least 128K)")
    up.add_argument("--slurm", action="store_true", help="a Slurm: slurmctld on the head, slurmd on every node")
    up.add_argument("--shared", metavar="DIR", help="the cluster's shared folder, the same path on every node "
                                                    "(default $WORKBENCH_STATE_DIR/vcluster/NAME/shared)")
    up.add_argument("--timeout", type=positive_seconds, default=60, help="seconds to wait for the nodes (default 60)")
    up.set_defaults(func=up_command)

    status = cmds.add_parser("status", help="nodes and links, with the bytes each link has sent")
    status.add_argument("name")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=status_command)

    cmds.add_parser("list", help="the virtual clusters that are up").set_defaults(func=list_command)

    ex = cmds.add_parser("exec", help="run one command on one node", usage="%(prog)s NAME --node I -- CMD...")
    ex.add_argument("name")
    ex.add_argument("--node", type=int, required=True, help="the node's index, 0..N-1")
    ex.add_argument("--timeout", type=positive_seconds, default=None, help="seconds before the command is killed")
    ex.set_defaults(func=exec_command, argv=[])  # the command: what follows `--` (workbench.cli.main)

    mpi = cmds.add_parser("mpiexec", help="an MPI job across the nodes (hydra through the nodes' namespaces, TCP)",
                          usage="%(prog)s NAME -n R [--ppn K] -- CMD...")
    mpi.add_argument("name")
    mpi.add_argument("-n", "--ranks", type=positive_int, required=True, dest="ranks", help="MPI ranks")
    mpi.add_argument("--ppn", type=positive_int, default=1, help="ranks per node, block placement (default 1)")
    mpi.add_argument("--timeout", type=positive_seconds, default=3600,
                     help="seconds before the job is killed (default 3600)")
    mpi.set_defaults(func=mpiexec_command, argv=[])

    env = cmds.add_parser("env", help="export lines for a shell on the head")
    env.add_argument("name")
    env.set_defaults(func=env_command)

    for fault, text in FAULTS.items():
        parser = cmds.add_parser(fault, help=text)
        parser.add_argument("name")
        parser.add_argument("--node", type=int, required=True, help="the node's index, 0..N-1")
        if fault == "kill":
            parser.add_argument("--down", action="store_true",
                                help="its links go down too: a crashed machine, answering nothing until `restore`")
        parser.set_defaults(func=fault_command)

    down = cmds.add_parser("down", help="remove it (its shared folder stays)")
    down.add_argument("name")
    down.set_defaults(func=down_command)


#: the faults a user injects (Jepsen's nemesis for the virtual cluster), with what each does
FAULTS = {"kill": "every process on a node dies at once (a crash; the node stays, its files too)",
          "partition": "cut a node off: its links down, its processes run on",
          "heal": "a partitioned node's links up again",
          "restore": "a node back, empty: no process, its /tmp and /dev/shm emptied, its links up"}


def fault_command(args) -> int:
    code = _inside(args)
    if code is not None:
        return code
    try:
        vc = _attach(args)
        node = args.node
        vc.check_node(node)
        done = _FAULT_DONE[args.vcluster_command](vc, node, args)
        print(f"vcluster {vc.name}: node {node} ({vc.hostnames[node]}) {done}")
    except _errors() as exc:
        return _fail(args.vcluster_command, exc)
    return 0


def _killed(vc, node: int, args) -> str:
    killed = len(vc.kill_node(node, down=args.down))
    return f"killed: {killed} processes" + (f"; its links are down until `workbench vcluster restore {vc.name} --node "
                                            f"{node}`" if args.down else "")


def _cut_off(vc, node: int, args) -> str:
    vc.partition(node)
    return f"cut off: its links are down (`workbench vcluster heal {vc.name} --node {node}`)"


def _healed(vc, node: int, args) -> str:
    vc.heal(node)
    return "healed: its links are up"


def _restored(vc, node: int, args) -> str:
    done = vc.restore(node)
    return (f"restored, empty: {done['processes']} processes killed, {done['files']} entries of /tmp and /dev/shm "
            "removed, links up")


#: each fault's action on the cluster, returning what it says after the node's name
_FAULT_DONE = {"kill": _killed, "partition": _cut_off, "heal": _healed, "restore": _restored}


def _fail(command: str, exc: Exception) -> int:
    print(f"workbench vcluster {command}: error: {exc}", file=sys.stderr)
    return 2 if exc.__class__.__name__ == "PlanError" else 1


def _errors():
    from ..vcluster import PlanError, VirtualClusterError
    return PlanError, VirtualClusterError


def _inside(args) -> int | None:
    """Not root: run this command inside the cluster's user namespace (:mod:`workbench.vcluster.rootless`);
    its exit code, or None where this process may go on (root, or inside already)."""
    from ..vcluster import rootless
    try:
        return rootless.reenter(args)
    except _errors() as exc:
        return _fail(args.vcluster_command, exc)


def _attach(args):
    from ..vcluster import VirtualCluster
    return VirtualCluster.attach(args.name)


def up_command(args) -> int:
    from ..checks import writable_folder
    from ..vcluster import PlanError, VirtualCluster, rootless
    try:
        if args.shared:  # made on the host before the nodes: checked before anything is built
            writable_folder("--shared", args.shared, PlanError)
        vc = VirtualCluster(args.name, args.nodes, args.topology, args.bandwidth, args.latency, slurm=args.slurm,
                            shared=args.shared, queue=args.queue, keep=True)
        if not rootless.is_root():
            rootless.up(vc, args.timeout)
        else:
            vc.up(timeout=args.timeout)
    except _errors() as exc:
        return _fail("up", exc)
    from ..vcluster.plan import format_rate
    p = vc.plan
    took = f" in {vc.up_seconds:.2f} s" if vc.up_seconds is not None else ""
    print(f"vcluster {p.name} up{took}: {p.nodes} nodes ({', '.join(vc.hostnames[:4])}"
          f"{', ...' if p.nodes > 4 else ''}), {p.topology}, links {format_rate(p.bandwidth)}"
          f"{', latency ' + str(args.latency) if args.latency else ''}; head {p.head_address} on {p.bridge}; "
          f"shared folder {p.shared}" + ("; Slurm up (`workbench vcluster env " + p.name + "`)" if p.slurm else ""))
    return 0


def status_command(args) -> int:
    code = _inside(args)
    if code is not None:
        return code
    from tabulate import tabulate
    try:
        info = _attach(args).status()
    except _errors() as exc:
        return _fail("status", exc)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"vcluster {info['name']}: {info['topology']}, {info['bandwidth']} links, head {info['head_address']} on "
          f"{info['bridge']}, shared folder {info['shared']}{', Slurm' if info['slurm'] else ''}\n")
    print(tabulate([[n["node"], n["hostname"], n["address"], n["processes"]] for n in info["nodes"]],
                   headers=["node", "hostname", "address", "processes"]))
    print()
    print(tabulate([["head" if link["node"] is None else link["node"], link["device"], link["rate"], link["bytes_sent"],
                     link["drops"]] for link in info["links"]],
                   headers=["node", "device", "rate", "bytes sent", "drops (queue full)"]))
    return 0


def list_command(args) -> int:
    from ..vcluster import registry, rootless
    rows = rootless.records()
    if not rows:
        print("no virtual cluster is up")
    for r in rows:
        state = r.get("state")
        if registry.owner_gone(r):  # still wired, but the process that made it is gone
            state = (f"{state}, its owner (pid {r['owner']['pid']}) gone: `workbench vcluster down {r['name']}`, "
                     f"or the next `up` removes it")
        print(f"{r['name']:10s} {r['nodes']:4d} nodes  {r['topology']:14s} {r['bandwidth']:>14,d} bit/s  {state}")
    return 0


def _command(args, what: str) -> list[str] | None:
    argv = list(args.argv)
    if not argv:
        print(f"workbench vcluster {what}: error: give the command after --, e.g. -- hostname", file=sys.stderr)
        return None
    return argv


def _prepare(args, what: str) -> tuple[list[str], int | None]:
    """The command after ``--``, and an exit code when this process is done already (no command, or the
    command ran inside a rootless cluster's user namespace)."""
    argv = _command(args, what)
    return (argv, 2) if argv is None else (argv, _inside(args))


def exec_command(args) -> int:
    argv, code = _prepare(args, "exec")
    if code is not None:
        return code
    try:
        vc = _attach(args)
        prefix = vc.enter(args.node)
    except _errors() as exc:
        return _fail("exec", exc)
    return _run([*prefix, *argv], args.timeout, "exec")


def mpiexec_command(args) -> int:
    argv, code = _prepare(args, "mpiexec")
    if code is not None:
        return code
    import os

    from ..mpilib import MPIFlavourError, find_mpiexec, flavour_of
    from ..runtime.launch.mpiexec import rank_environment
    try:
        vc = _attach(args)
        mpiexec = find_mpiexec()
        mpi = flavour_of(mpiexec)
        cmd = [*vc.launcher_network(), mpiexec, "-n", str(args.ranks), *mpi.start_args(args.ranks, placed=True),
               *vc.mpiexec_args(args.ranks, args.ppn, flavour=mpi), *argv]
    except (*_errors(), FileNotFoundError, MPIFlavourError) as exc:
        return _fail("mpiexec", exc)
    env = rank_environment(vc.mpi_env(mpi))
    os.environ.update(env)
    return _run(cmd, args.timeout, "mpiexec")


def _run(cmd: list[str], timeout: float | None, what: str) -> int:
    """Run ``cmd`` with this terminal; SIGINT reaches it too (same process group); killed at the timeout."""
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        print(f"workbench vcluster {what}: killed after its {timeout:g} s timeout", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 130


def env_command(args) -> int:
    try:
        print(_attach(args).env_lines())
    except _errors() as exc:
        return _fail("env", exc)
    return 0


def down_command(args) -> int:
    from ..vcluster import VirtualCluster, rootless
    from ..vcluster.plan import check_name
    try:
        check_name(args.name)
        record = rootless.read_any(args.name)
        if record is None:
            print(f"vcluster {args.name} was not up")
            if rootless.is_root():
                from ..vcluster import registry, wiring
                with registry.locked():
                    wiring.teardown(args.name)  # whatever a crash left under that name
            return 0
        vc = VirtualCluster.attach(args.name) if record.get("state") == "up" else None
        removed = vc.down() if vc is not None else rootless.teardown_any(args.name)
    except _errors() as exc:
        return _fail("down", exc)
    print(f"vcluster {args.name} down: removed {', '.join(removed)}")
    return 0
