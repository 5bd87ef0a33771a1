"""workbench: a Jupyter-based research workbench for distributed deep-learning training on HPC
clusters (EASGD family, pluggable and measurable collectives).

Public names: ``collectives`` (Schedule, Transfer, schedules, allreduce) and ``allreduce``.
Training, clusters, dashboards and the results store arrive with later issues (see README).
"""
from . import collectives
from .collectives import allreduce

__version__ = "0.1.0"
__all__ = ["collectives", "allreduce", "__version__"]
