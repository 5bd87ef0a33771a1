"""A free TCP port on this host, for a rendezvous that needs one (torch.distributed's gloo
peer in the benchmarks, a test's Jupyter server). Every server binds 127.0.0.1 only, except the
rendezvous of ranks on a virtual cluster's nodes (:func:`torch_init_method`), which can reach one
another only through their node addresses."""
from __future__ import annotations

import os
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it; race-free enough for a
    rendezvous started right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torch_init_method(comm) -> str:
    """torch.distributed's ``init_method`` (``tcp://HOST:PORT``) for the ranks of the MPI communicator
    ``comm`` (collective; the same on every rank): rank 0's address and a port free there. On a
    virtual cluster's node (``WORKBENCH_VCLUSTER``, set by its ``mpi_env``) the node's own address, which
    its ``/etc/hosts`` gives its name (ranks on other nodes cannot reach its 127.0.0.1; gloo's own
    interface is ``eth0``, ``GLOO_SOCKET_IFNAME``); on one host ``127.0.0.1``."""
    where = None
    if comm.Get_rank() == 0:
        host = socket.gethostbyname(socket.gethostname()) if os.environ.get("WORKBENCH_VCLUSTER") else "127.0.0.1"
        where = f"tcp://{host}:{free_port(host)}"
    return comm.bcast(where)
