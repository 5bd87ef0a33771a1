"""DeepPool's burst parallelism (Park et al., MLSys'22): every layer its own data-parallel width.

- :mod:`.graph`: the planner's inputs, a model as a layer graph and a per-layer time table (the
  published A100 tables and model lists ship in ``data/``, MIT; notice in
  ``data/LICENSE-DeepPool.txt``); pure.
- :mod:`.plan`: the output every part shares (:class:`~.plan.BurstPlan`); pure.
- :mod:`.costs`, :mod:`.planner` (and its :mod:`.search`): the workbench's cost model and
  dynamic-programming planner; pure.
- :mod:`.deeppool` (and its cost terms, :mod:`.deeppool_costs`): the published planner's cost model
  and search, reproduced decision for decision (``--cost-model deeppool``); pure.
- :mod:`.multiplex`: filling a burst-parallel job's idle GPU windows with a background job, a
  discrete-event simulation; pure.
- :mod:`.profiler` (``workbench.burst.profile(model, input_shape, batch_sizes)``), :mod:`.layergraph`:
  per-layer forward/backward times of a torch model and its layer graph (torch.fx; the layer types of
  torch's modules and ops in :mod:`.layerkinds`) (torch).
- :mod:`.execute`: a plan run for real over MPI sub-communicators (torch, mpi4py in the ranks).
- :mod:`.reference`: what such a run must equal, the single-process run on the same batches (torch).

Submodules load on first use: ``import workbench.burst`` imports neither torch nor mpi4py. The
planner is ``workbench.burst.planner.plan`` (``workbench.burst.plan`` is the module of the
:class:`~.plan.BurstPlan` it returns).
"""
from ..lazy import lazy

_lazy, __dir__ = lazy(__name__, {
    "BurstError": (".graph", "BurstError"),
    "load_model": (".graph", "load_model"),
    "load_profile": (".graph", "load_profile"),
    "BurstPlan": (".plan", "BurstPlan"),
    "ActivationTransfer": (".plan", "ActivationTransfer"),
    "plan_deeppool": (".deeppool", "plan_deeppool"),
    "profile": (".profiler", "profile"),
    "layer_graph": (".layergraph", "layer_graph"),
    "simulate": (".multiplex", "simulate"),
    "execute": (".execute", "execute"),
})


def __getattr__(name: str):
    """The lazy names; ``Plan`` and ``Transfer``, renamed ``BurstPlan`` and ``ActivationTransfer``,
    for one more release with a DeprecationWarning (:data:`.plan.RENAMED`)."""
    if name in ("Plan", "Transfer"):
        from .plan import renamed
        return renamed(name, __name__)
    return _lazy(name)


__all__ = ["ActivationTransfer", "BurstError", "BurstPlan", "execute", "layer_graph", "load_model", "load_profile",
           "plan_deeppool", "profile", "simulate"]
