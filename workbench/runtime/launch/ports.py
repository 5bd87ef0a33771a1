"""A free TCP port on this host, for a rendezvous that needs one (torch.distributed's gloo
peer in the benchmarks, a test's Jupyter server). Every server binds 127.0.0.1 only."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it; race-free enough for a
    rendezvous started right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
