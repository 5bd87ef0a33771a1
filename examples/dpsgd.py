"""Decentralized parallel SGD (D-PSGD; Lian et al., "Can Decentralized Algorithms Outperform
Centralized Algorithms?", NeurIPS 2017) as a researcher's own algorithm: no edit of workbench.

Each rank keeps its own model and talks only to its two neighbours on a ring. Every step it sends
its weights to both, computes its gradient meanwhile, then moves to the average of the three models
minus its own gradient step:

    x_i <- (x_{i-1} + x_i + x_{i+1}) / 3 - lr * g_i(x_i)

(the mixing matrix W with 1/3 on the diagonal and on both ring neighbours). No all-reduce: each rank
sends 2 messages of the model's size per step, whatever the rank count, where a ring all-reduce
sends 2(N-1)/N of it in 2(N-1) steps. The models differ between ranks and agree only in the limit;
rank 0's model is the one evaluated.

This file is the definition only, importable without MPI or torch (the notebook kernel and the CLI
read it before any rank starts); the ranks' class is in ``dpsgd_rank.py`` beside it. Run it with the
folder on the path of the kernel and of the ranks::

    PYTHONPATH=examples workbench train --algorithm dpsgd:DPSGD --ranks 4 --epochs 10
    wb.RunConfig(algorithm="dpsgd:DPSGD", ranks=4)       # with examples/ on sys.path and PYTHONPATH
"""
from workbench.optim import LockStep
from workbench.optim.definition import MOMENTUM

DPSGD = LockStep(
    name="d-psgd",
    description="decentralized SGD: each rank averages its model with its two ring neighbours, then takes "
                "its own (momentum) gradient step; no all-reduce",
    worker="dpsgd_rank:DPSGDRank",
    default_lr=0.1,
    default_momentum=0.0,
    options=MOMENTUM,    # and the options every algorithm takes; no collective: it has no all-reduce
    exchange=None,       # the predictor has no model of a neighbour exchange: it says so
)
