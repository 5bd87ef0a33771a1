"""The schedule names the simulator times, importable without pandas or networkx (the CLI lists
them in its help: building ``workbench``'s parser must stay cheap, it runs in every invocation)."""
from __future__ import annotations

from .. import schedules

#: The paper's baselines and MultiTree, in the order tables show them.
PAPER_ALGORITHMS = ("ring", "double_binary_tree", "ring_2d", "ring_2d_bidir", "halving_doubling", "multitree")
#: Every name :func:`workbench.netsim.study.schedule_on` accepts.
SIM_ALGORITHMS = tuple(dict.fromkeys(PAPER_ALGORITHMS + tuple(schedules.SCHEDULES)))
