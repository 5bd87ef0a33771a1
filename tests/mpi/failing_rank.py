"""One rank raises while the others wait in a collective; or one rank hangs; or (``unforwarded``)
one rank writes its last words to stderr while the launcher's process that forwards its output
(hydra's proxy, the parent of the rank guard's front) is stopped, then kills that process and hangs.

Usage: python -m mpi4py tests/mpi/failing_rank.py raise|hang|unforwarded RANK
"""
import os
import signal
import sys
import time

from mpi4py import MPI

mode, bad = sys.argv[1], int(sys.argv[2])
if MPI.COMM_WORLD.Get_rank() == bad:
    if mode == "raise":
        raise RuntimeError(f"injected failure on rank {bad}")
    if mode == "unforwarded":
        proxy = os.getppid()  # the guard, then its front, then the front's parent: hydra's proxy
        for _ in range(2):
            with open(f"/proc/{proxy}/stat") as f:
                proxy = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(proxy, signal.SIGSTOP)
        print(f"last words of rank {bad}", file=sys.stderr, flush=True)
        os.kill(proxy, signal.SIGKILL)
    time.sleep(3600)
MPI.COMM_WORLD.Barrier()
