"""Names of the files in a run directory, shared by the ranks, the notebook and the CLI.

Pure (no torch, no MPI): the notebook kernel and the CLI read these names too.
"""
from __future__ import annotations

#: written by ``Run.cancel()`` / an interrupted CLI; the ranks stop at their next look
CANCEL_FILE = "CANCEL"
