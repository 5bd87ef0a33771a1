"""The rank's one communicator (``workbench/comm/communicator.py``): every exchange of every family
goes through it and is counted in one counter, the one ``summary.json`` reports. The collective
part runs under ``mpiexec -n 3`` (tests/mpi/one_counter.py: the communicator's paths against their
byte formulas, then a real run of each family: sync-sgd, sync-easgd, diloco, streaming-diloco,
async-easgd, and the user's D-PSGD from ``examples/``)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.mpi


def test_every_family_counts_every_message_in_the_one_counter_the_summary_reports(mpi, tmp_path):
    result = mpi(3, "tests/mpi/one_counter.py", str(tmp_path), timeout=300)
    assert "one counter: ok sync-sgd sync-easgd diloco streaming-diloco async-easgd dpsgd" in result.output

