"""The network model: a :class:`~workbench.schedules.Schedule` timed on a
:class:`~workbench.network.Topology` instead of executed (lock-step and flow simulation),
calibration of its link parameters from measured all-reduces, and the MultiTree study.

Pure Python + numpy/pandas (scipy for the fit): no MPI, no torch. Submodules load on first use.
"""
from ..lazy import lazy

__getattr__, __dir__ = lazy(__name__, {
    "simulate": (".simulator", "simulate"),
    "SimResult": (".simulator", "SimResult"),
    "SimulationError": (".simulator", "SimulationError"),
    "link_use": (".simulator", "link_use"),
    "PAPER_BANDWIDTH": (".simulator", "PAPER_BANDWIDTH"),
    "PAPER_LATENCY": (".simulator", "PAPER_LATENCY"),
    "MODES": (".simulator", "MODES"),
    "calibrate": (".calibration", "calibrate"),
    "Calibration": (".calibration", "Calibration"),
    "CalibrationError": (".calibration", "CalibrationError"),
    "load_measurements": (".calibration", "load_measurements"),
    "study": (".study", None),
})

__all__ = ['Calibration', 'CalibrationError', 'MODES', 'PAPER_BANDWIDTH', 'PAPER_LATENCY', 'SimResult', 'SimulationError', 'calibrate', 'link_use', 'load_measurements', 'simulate', 'study']
