"""The Debian packages that workbench uses, what each is for, and installing the missing ones.

Every make target installs the packages it uses before it runs anything (``make demo`` the data and
the virtual cluster's tools, ``make test`` all of them). The Makefile calls this file with the
system Python, before the venv exists, so it imports the standard library only::

    python3 workbench/syspkgs.py install --for "make demo" PACKAGE...   # apt-get install the missing ones
    python3 workbench/syspkgs.py install --optional "WHAT GOES ON" ...  # ... or say why not and go on
    python3 workbench/syspkgs.py fresh     # the declared packages a fresh Debian lacks (CI removes them first)
    python3 workbench/syspkgs.py list      # each package, whether it is here, and what it is for

A package is here when its files are (:attr:`Package.files`), whoever installed it. The missing ones
are installed with ``apt-get`` as root, or through ``sudo -n`` (sudo without a password); where
neither works, one line names the packages and the command that installs them, and ``install``
exits 2, or 0 with ``--optional`` (the caller goes on without them, as the line says).

``tests/test_syspkgs.py`` keeps this table true: every Debian file or program that the code, the
tests and the notebooks name belongs to a package declared here (or to one every Debian system
has), and every make target installs each package that what it runs uses (:attr:`Package.uses`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


@dataclass(frozen=True)
class Package:
    why: str
    #: the files whose presence says the package is here (what the code runs or reads)
    files: tuple[str, ...]
    #: words that, found in what a make target runs (a notebook, a module, the tests), mean that it
    #: uses this package: the target must install it
    uses: tuple[str, ...]
    #: on every Debian system (priority required or important): CI does not remove it first
    base: bool = False


PACKAGES: dict[str, Package] = {
    "dataset-fashion-mnist": Package(
        "Fashion-MNIST's four IDX files, dataset='fashion-mnist' (the demo, notebooks 01, 07 and 08)",
        tuple(f"{FASHION_MNIST_DIR}/{name}-ubyte.gz" for name in (
            "train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1")),
        uses=("fashion-mnist",)),
    "iproute2": Package(
        "ip and tc: the virtual cluster's namespaced nodes, links and link shaping",
        ("/usr/sbin/ip", "/usr/sbin/tc"), uses=("vcluster", "VirtualCluster"), base=True),
    "util-linux": Package(
        "nsenter, unshare and setpriv: entering the virtual cluster's nodes, rootless clusters, dropping privileges",
        ("/usr/bin/nsenter", "/usr/bin/unshare", "/usr/bin/setpriv"), uses=("vcluster", "VirtualCluster"),
        base=True),
    "chromium": Package(
        "headless Chromium: the browser test of the dashboards",
        ("/usr/bin/chromium",), uses=("chromium",)),
    "slurmctld": Package(
        "Slurm's controller: the private single-node Slurm of the Slurm tests and make slurm-up",
        ("/usr/sbin/slurmctld",), uses=("slurm_local", "slurmctld")),
    "slurmd": Package(
        "Slurm's node daemon: the private Slurm's nodes",
        ("/usr/sbin/slurmd",), uses=("slurm_local", "slurmd")),
    "slurm-client": Package(
        "srun, sbatch, squeue, scancel, scontrol and sinfo: launching and watching Slurm jobs",
        ("/usr/bin/srun", "/usr/bin/sbatch", "/usr/bin/squeue", "/usr/bin/scontrol"),
        uses=("slurm_local", "srun")),
    "libpmix-dev": Package(
        "PMIx for Slurm's --mpi=pmix (its plugin loads libpmix.so): Open MPI 5's ranks under srun",
        ("/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so",), uses=("mpi=pmix",)),
    "munge": Package(
        "munged: the private Slurm's authentication",
        ("/usr/sbin/munged",), uses=("slurm_local", "munge")),
}

#: what the two commands need before they can install anything: on a fresh machine, never installed by a target
BOOTSTRAP: dict[str, str] = {
    "make": "runs `make demo` and `make test`",
    "git": "the clone; the tests list the project's files with it",
    "python3-minimal": "/usr/bin/python3 (3.10 or newer), the interpreter of the venv, and of a test's second user",
}


def missing(names) -> list[str]:
    """The packages among ``names`` that are not here (one of their files is absent)."""
    return [name for name in names if not all(os.path.exists(f) for f in PACKAGES[name].files)]


def advice(*names: str) -> str:
    """How to install ``names``, for an error message."""
    return (f"apt-get install {' '.join(names)}; `make demo` and `make test` install what they use "
            "(as root, or with password-less sudo)")


def _installer() -> list[str] | None:
    """The prefix that runs apt-get as root here: ``[]`` as root, ``["sudo", "-n"]`` where sudo needs
    no password, None where neither works."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    if sudo and subprocess.run([sudo, "-n", "true"], capture_output=True, timeout=30).returncode == 0:
        return [sudo, "-n"]
    return None


def install(names: list[str], *, who: str = "workbench", optional: str | None = None) -> int:
    """Install the missing packages among ``names``; 0 when they are all here afterwards. Where they
    cannot be installed, one line on stderr, and 2 (or 0 when ``optional`` says what goes on without them)."""
    unknown = [name for name in names if name not in PACKAGES]
    if unknown:
        print(f"{who}: {', '.join(unknown)} not declared in workbench/syspkgs.py's PACKAGES: declare "
              "what each is for and its files there", file=sys.stderr)
        return 2
    todo = missing(names)
    if not todo:
        return 0
    prefix = _installer()
    if prefix is None:
        print(f"{who}: Debian's {' '.join(todo)} missing and not installable here (not root, no password-less sudo): "
              f"run `sudo apt-get install {' '.join(todo)}`" + (f"; {optional}" if optional else ""), file=sys.stderr)
        return 0 if optional else 2
    print(f"{who}: installing Debian's {' '.join(todo)} ({'; '.join(PACKAGES[n].why for n in todo)})", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *todo]):
        try:
            done = subprocess.run([*prefix, *argv], env=env, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            done = None
            print(f"{who}: {' '.join(argv[:2])} failed: {exc}", file=sys.stderr)
        if done is None or done.returncode != 0:
            break
    still = missing(todo)
    if still:
        print(f"{who}: Debian's {' '.join(still)} could not be installed (apt-get's output above)"
              + (f"; {optional}" if optional else ""), file=sys.stderr)
        return 0 if optional else 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="syspkgs.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("install", help="install the missing ones among PACKAGE...")
    add.add_argument("packages", nargs="+", metavar="PACKAGE")
    add.add_argument("--for", dest="who", default="workbench", help="who needs them, for the messages")
    add.add_argument("--optional", metavar="WHAT_GOES_ON",
                     help="where they cannot be installed, say this and exit 0 instead of 2")
    sub.add_parser("fresh", help="the declared packages that a fresh Debian system lacks, one a line")
    sub.add_parser("list", help="each declared package, whether it is here, and what it is for")
    args = parser.parse_args(argv)
    if args.command == "install":
        return install(args.packages, who=args.who, optional=args.optional)
    absent = set(missing(PACKAGES))
    for name, package in PACKAGES.items():
        if args.command == "fresh":
            if not package.base:
                print(name)
        else:
            print(f"{name:22s} {'missing' if name in absent else 'here':8s} {package.why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
