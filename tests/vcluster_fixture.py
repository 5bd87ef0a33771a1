"""Virtual clusters for the multi-node tests (:mod:`workbench.vcluster`).

``vc4``: one cluster for the session, 4 nodes on a switch at 1 Gbit/s, named ``t<pid>`` (its
namespaces, interfaces and folders carry that name, so a test run beside another leaves the other's
alone), its shared folder in the session's scratch directory (the nodes see it at the same path;
their own ``/tmp`` and ``/dev/shm`` are empty). Where namespaces cannot be made (not root, no
``ip``/``unshare``), every test that uses it fails at setup with the one-line reason: never skipped.
``vcluster_name(tag)`` gives other tests a name of their own.
"""
from __future__ import annotations

import os

import pytest

from workbench.vcluster import PlanError, VirtualCluster, VirtualClusterError


def vcluster_name(tag: str) -> str:
    """A cluster name unique to this test process: ``tag`` (one letter) and the pid's last digits."""
    return f"{tag}{os.getpid() % 1_000_000}"[:8]


def start(vc: VirtualCluster) -> VirtualCluster:
    """``vc.up()``, or the test fails with the reason on one line."""
    reason = None
    try:
        vc.up()
    except (PlanError, VirtualClusterError, OSError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    if reason:
        pytest.fail(f"virtual cluster unavailable: {reason}", pytrace=False)
    return vc


@pytest.fixture(scope="session")
def vc4(tmp_path_factory):
    vc = start(VirtualCluster(vcluster_name("t"), nodes=4, topology="switch", bandwidth="1gbit",
                              shared=tmp_path_factory.mktemp("vc4-shared")))
    try:
        yield vc
    finally:
        vc.down()
