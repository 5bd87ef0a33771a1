"""Running ``ip``, ``tc`` and friends for the virtual cluster, with one-line errors."""
from __future__ import annotations

import os
import shutil
import subprocess

from ..syspkgs import advice


class VirtualClusterError(RuntimeError):
    """A virtual cluster could not be built, entered or removed; the message says why, on one line."""


def tool(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"]))
    if not found:
        raise VirtualClusterError(f"{name} not found: install iproute2 and util-linux "
                                  f"({advice('iproute2', 'util-linux')})")
    return found


def run(argv: list[str], what: str, *, input: str | None = None, timeout: float = 30, check: bool = True):
    """Run a tool; a failure is a VirtualClusterError naming ``what`` with the tool's own words."""
    try:
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VirtualClusterError(f"{what}: {argv[0]} did not finish in {timeout:g} s") from None
    if check and proc.returncode != 0:
        said = " ".join((proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}").split())
        raise VirtualClusterError(f"{what}: {said[:400]}")
    return proc


def ip_batch(lines: list[str], what: str, netns: str | None = None, force: bool = False) -> None:
    """``ip -batch``: ``force`` goes on past a line that fails (removing what may be gone already)."""
    if lines:
        run([tool("ip"), *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"], what,
            input="\n".join(lines) + "\n", check=not force)


def tc_batch(lines: list[str], what: str, netns: str | None = None) -> None:
    if lines:
        run([tool("tc"), *(["-n", netns] if netns else []), "-batch", "-"], what, input="\n".join(lines) + "\n")
