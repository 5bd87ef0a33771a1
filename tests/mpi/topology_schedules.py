"""Run topology-aware schedules (MultiTree, 2D ring) for real and compare with MPI_Allreduce.

Usage: python -m mpi4py tests/mpi/topology_schedules.py ROWS COLS   (ROWS*COLS ranks)
"""
import sys

import numpy as np
import torch
from mpi4py import MPI

from workbench.collectives import schedules, topology
from workbench.comm.buffers import FlatBuffer
from workbench.comm.executor import execute, private_comm

rows, cols = int(sys.argv[1]), int(sys.argv[2])
comm = MPI.COMM_WORLD
assert comm.Get_size() == rows * cols, "launch with ROWS*COLS ranks"
rank = comm.Get_rank()
cases = [schedules.multitree(topology.torus(rows, cols), k) for k in (2, 3)]
cases += [schedules.multitree(topology.mesh(rows, cols), 2), schedules.ring_2d(rows, cols),
          schedules.ring_2d(rows, cols, bidirectional=True),
          schedules.multitree(topology.fat_tree(rows * cols, nodes_per_leaf=cols), 2),
          schedules.multitree(topology.bigraph(rows * cols, switches_per_layer=1), 2)]
private = private_comm(comm)
for schedule in cases:
    for length in (0, 1, 7, 1000, 4099):
        for dtype in (np.float64, np.int32):
            data = (np.arange(length) * (rank + 1) + rank).astype(dtype)
            expected = np.empty_like(data)
            comm.Allreduce(data, expected, op=MPI.SUM)
            mine = data.copy()
            execute(schedule, FlatBuffer(mine), private)
            assert np.array_equal(mine, expected), (schedule.name, schedule.params, length, dtype, rank)
    tensor = torch.full((333,), float(rank))
    execute(schedule, FlatBuffer(tensor), private)
    assert torch.all(tensor == sum(range(comm.Get_size()))), schedule.name
if rank == 0:
    print(f"ok {len(cases)} schedules on a {rows}x{cols} grid", flush=True)
