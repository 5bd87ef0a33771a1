"""A network of the job's own: the launcher and its ranks in a new network namespace that holds only
a loopback, so that nothing they listen on can be reached by another user of this host.

MPICH's hydra listens for its proxies on 0.0.0.0 without authentication, whatever ``-iface`` says
(anyone who connects and sends one header ends the job, or races the proxy for the launch
information); the ranks' own transports (libfabric TCP, Open MPI's out-of-band channel) listen on the
host's addresses too. On a login node every other user can reach those ports. A job on one host needs
no network but a loopback, so the launcher is started as::

    python private_net.py mpiexec -n 4 ...

which enters a new user namespace (the same uid and gid mapped to themselves; skipped as root) and a
new network namespace, brings its loopback up and execs the command. The command keeps this user's
uid, files, processes and signals (only the network is new); it holds no capability once exec'd. The
kernel and the CLI reach the ranks through files and Unix sockets in the user's 0700 folders, which a
network namespace does not cut. Runs across nodes (a virtual cluster, Slurm) are not started this way.

``$WORKBENCH_NETWORK``: ``private`` (refuse to start without it), ``host`` (the host's network, as
before), or ``auto`` (the default: private where the kernel lets users make namespaces, else the
host's, with a warning once). Standard library only: run by path, it starts in milliseconds.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import socket
import struct
import subprocess
import sys

#: environment variable that chooses the network of single-host jobs
ENV = "WORKBENCH_NETWORK"
MODES = ("auto", "private", "host")
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


class PrivateNetworkError(RuntimeError):
    """``$WORKBENCH_NETWORK`` is not a mode, or asks for a private network this kernel refuses."""


def enter() -> None:
    """Move this process into a new network namespace (and, unless root, a new user namespace that
    maps this uid and gid to themselves) and bring its loopback up. OSError when the kernel refuses."""
    uid, gid = os.geteuid(), os.getegid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET | (CLONE_NEWUSER if uid != 0 else 0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def mode() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise PrivateNetworkError(f"{ENV}={value!r} is not one of {', '.join(MODES)}; unset it (auto: a private "
                                  "network where this host allows it)")
    return value


@functools.lru_cache(maxsize=1)
def why_not() -> str | None:
    """Why a job cannot have a network of its own here (None: it can), asked of a child once."""
    try:
        done = subprocess.run([sys.executable, __file__, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["refused"])[-1]


_warned: list[str] = []


def prefix() -> list[str]:
    """What goes before a single-host launcher's argv: this file under this Python, or nothing (the
    host's network: ``$WORKBENCH_NETWORK=host``, or ``auto`` where namespaces are refused, said once
    on stderr). :class:`PrivateNetworkError` for ``private`` where it cannot be had."""
    chosen = mode()
    if chosen == "host":
        return []
    reason = why_not()
    if reason is None:
        return [sys.executable, __file__]
    if chosen == "private":
        raise PrivateNetworkError(f"{ENV}=private: this host gives a job no network of its own ({reason}); "
                                  f"set {ENV}=host to use the host's network")
    if not _warned:
        _warned.append(reason)
        print(f"workbench: warning: MPI jobs use the host's network (other users of this host can reach their "
              f"ports): no network namespace for this user ({reason}); set {ENV}=host to say so and not be "
              "warned", file=sys.stderr)
    return []


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: private_net.py COMMAND [ARGS...]")
    try:
        enter()
    except OSError as exc:
        sys.exit(f"workbench: no network namespace for uid {os.geteuid()}: {exc.strerror or exc}")
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
