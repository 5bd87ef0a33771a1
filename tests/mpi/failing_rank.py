"""One rank raises while the others wait in a collective; or one rank hangs.

Usage: python -m mpi4py tests/mpi/failing_rank.py raise|hang RANK
"""
import sys
import time

from mpi4py import MPI

mode, bad = sys.argv[1], int(sys.argv[2])
if MPI.COMM_WORLD.Get_rank() == bad:
    if mode == "raise":
        raise RuntimeError(f"injected failure on rank {bad}")
    time.sleep(3600)
MPI.COMM_WORLD.Barrier()
