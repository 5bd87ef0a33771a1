"""Every rank passes a different length: the all-reduce must fail with a clear error, not hang.

Usage: python -m mpi4py tests/mpi/mismatch.py ALGORITHM
"""
import sys

import numpy as np
from mpi4py import MPI

from workbench.collectives import allreduce

rank = MPI.COMM_WORLD.Get_rank()
allreduce(np.ones(10 + 3 * rank, np.float32), MPI.COMM_WORLD, sys.argv[1])
print("no error raised", flush=True)
