"""``python -m workbench.runtime.launch.slurm_cli up|down``: a private Slurm by hand (``make
slurm-up`` / ``make slurm-down``), and what :class:`~workbench.vcluster.slurm_local.LocalSlurm`
runs under ``sudo -n`` when it is not root.

    python -m workbench.runtime.launch.slurm_cli up [--root DIR] [--mpi-default none|pmi2]
    python -m workbench.runtime.launch.slurm_cli down [--root DIR]
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import psutil

from workbench.runtime.launch.signals import STOP_SIGNALS
from workbench.vcluster.slurm_local import DEFAULT_ROOT, LocalSlurm, SlurmUnavailable, leftover_pids
from workbench.runtime.processes import alive, stop_processes


def _up_pid(root: Path) -> int | None:
    """The pid of the ``up`` running for ``root``, if any."""
    try:
        pid = int((root / "up.pid").read_text())
        return pid if str(root) in " ".join(psutil.Process(pid).cmdline()) and alive(pid) else None
    except (OSError, ValueError, psutil.Error):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.runtime.launch.slurm_cli",
                                     description="A private single-node Slurm (munged, slurmctld, slurmd).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start it, print `export SLURM_CONF=...`, run until Ctrl-C or `down`")
    up.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    up.add_argument("--mpi-default", choices=["none", "pmi2"], default="none")
    up.add_argument("--cpus", type=int, default=None)
    up.add_argument("--timeout", type=float, default=60)
    up.add_argument("--binary", action="append", default=[], metavar="NAME=PATH")
    up.add_argument("--cluster", default=None, help=argparse.SUPPRESS)
    up.add_argument("--remove", action="store_true", help=argparse.SUPPRESS)
    down = sub.add_parser("down", help="stop the one that `up --root DIR` started")
    down.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    args = parser.parse_args(argv)
    root = args.root.absolute()

    if args.cmd == "down":
        pid = _up_pid(root)
        stop_processes([pid] if pid else [], grace=60, kill_wait=5.0)     # `up` stops its Slurm on SIGTERM
        conf = (root / "slurm.conf").read_text() if (root / "slurm.conf").exists() else ""
        left = leftover_pids(root, conf.split("ClusterName=", 1)[-1].split()[0] if conf else None)
        stop_processes(left, grace=5, kill_wait=5.0)       # what an `up` killed with SIGKILL left behind
        print(f"local Slurm under {root}: " + ("stopped" if pid else "was not running") +
              (f", {len(left)} leftover processes killed" if left else ""))
        return 0

    if up := _up_pid(root):
        print(f"SlurmUnavailable: a local Slurm is already up under {root} (pid {up}); "
              f"`down --root {root}` stops it", file=sys.stderr)
        return 1
    slurm = LocalSlurm(root, args.cpus, args.mpi_default, dict(b.split("=", 1) for b in args.binary))
    slurm.cluster = args.cluster or slurm.cluster
    slurm._tmp = args.remove         # a LocalSlurm that is not root started this `up` with sudo

    for sig in STOP_SIGNALS:    # even where SIGINT was ignored
        signal.signal(sig, signal.default_int_handler)     # stop() as for Ctrl-C
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "up.pid").write_text(str(os.getpid()))
        slurm.start(args.timeout)
        print(f"local Slurm up in {slurm.start_seconds:.1f} s: cluster {slurm.cluster}, node "
              f"{slurm.node} ({slurm.cpus} CPUs), partition debug, MpiDefault={slurm.mpi_default}, "
              f"logs in {root / 'log'}; stop it with Ctrl-C or `down --root {root}`", file=sys.stderr)
        print(f"export SLURM_CONF={slurm.conf}", flush=True)
        while True:
            signal.pause()
    except SlurmUnavailable as exc:
        print(f"SlurmUnavailable: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        slurm.stop()
        (root / "up.pid").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
