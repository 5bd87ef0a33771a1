"""The test session's private Slurm (:mod:`workbench.vcluster.slurm_local`).

``local_slurm`` starts one :class:`LocalSlurm` (own munged, slurmctld and slurmd on 127.0.0.1
under a temporary directory; ``MpiDefault=none``) for the whole session and stops it at the end.
When it cannot start (Slurm not installed: ``make slurm``; not root and no ``sudo -n``; a daemon
exits), every test that uses it fails with the one-line reason (pytest reports it as an ERROR at
setup, once per test; the run fails): it is never skipped. Tests that use it are marked ``slurm``.
"""
from __future__ import annotations

import pytest

from workbench.vcluster.slurm_local import LocalSlurm, SlurmUnavailable


@pytest.fixture(scope="session")
def local_slurm():
    slurm, reason = LocalSlurm(), None
    try:
        slurm.start(timeout=60)
    except SlurmUnavailable as exc:
        reason = str(exc)
    if reason:          # outside the except: the one line, without the chained traceback
        pytest.fail(f"local Slurm unavailable: {reason}", pytrace=False)
    try:
        yield slurm
    finally:
        slurm.stop()
