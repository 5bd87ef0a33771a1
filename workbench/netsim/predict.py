"""Scale-out predictor: step time, communication share and scaling of data-parallel training on
N ranks, from a per-layer model profile and a network model (GradientFlow's question: why do
popular systems reach 2.5x on 64 GPUs, and what does each strategy buy at 512?).

    from workbench.netsim.predict import predict, scaling, easgd_shares
    from workbench.netsim.profile import alexnet_profile
    p = alexnet_profile()                                  # 61.1M parameters, 128 images per GPU
    predict(p, 64, fusion_bytes=0)                         # dense fp32, one all-reduce per tensor
    scaling(p, [1, 8, 64, 512], options="gradientflow")    # a DataFrame, one row per rank count

**The iteration model** (``sync-sgd``) applies the strategies the way the runtime
(:mod:`workbench.comm.strategies`) does. Forward runs the layers in order, backward in reverse;
a layer's gradients are ready when its backward ends. Buckets are cut by the runtime's own
:func:`~workbench.comm.buckets.bucket_bounds` (backward order, closed at ``>= fusion_bytes``
float32 bytes; ``0``: one per tensor, ``None``: one per step). One message is on the network at a
time (MPI progress serialises them): with ``overlap`` bucket k's all-reduce starts at max(its last
gradient ready, the previous message's end); without, after backward. A bucket sends
``elements x wire itemsize`` bytes (fp16/bf16: 2); with CSC (``sparse_ratio``) first its ``K =
ceil(elements / sparse_chunk)`` float32 chunk norms, then ``ceil(ratio K) x sparse_chunk``
selected elements in the wire dtype (dense when that is every chunk; the short last chunk is
assumed unselected). fp16/bf16 add one float all-reduced after every bucket (the overflow
decision; MPI's native all-reduce, timed as recursive doubling, counted as the runtime counts it:
``round(2(N-1)/N x 4)`` bytes). The step ends at max(backward end, last message end) + that
decision + ``update_s``. CSC is predicted after its warm-up (the steady ratio). A network with a
burst (a shaped link's token bucket, ``AlphaBeta.burst``) sends each step's first bytes at once:
the bucket, refilled while the link was idle since the previous step's last message (capped at
its depth), shortens the messages it covers, and refills in the gaps between them.

**Stragglers** (``skew_s``, default 0: dedicated devices). A lock-step message waits for every
rank; ``skew_s`` is how much later than the profile's (average) rank the slowest rank finishes its
forward + backward, E[max over ranks] - mean. The slowest rank's gradients become ready
proportionally later (its ready times are the profile's times ``1 + skew_s / (forward +
backward)``), so messages start from them and the step cannot end before its backward does.
Ranks time-sliced on shared cores (this machine's 4 ranks on 2 cores) have such a skew;
:func:`workbench.bench.step.profile_step` measures it (``processes=N, lockstep=True``).

**The EASGD family and its descendants** (``sync-easgd``, ``easgd``; ``local-sgd``, ``diloco``,
``streaming-diloco``, whose ``tau`` is their ``sync_every``, H): one exchange every ``tau`` steps,
costed by :mod:`workbench.netsim.exchanges` (the burst too, spent on each exchange).

**Which model** an algorithm gets is what its definition declares (:attr:`~workbench.optim.definition.
Algorithm.exchange`: gradients, weights, round-robin, average, outer, streaming); an algorithm that
declares none is not predicted. :func:`predict_config` predicts a :class:`~workbench.config.RunConfig`
as it would run: its algorithm, ranks, collective, communication options and period (``tau`` or
``sync_every``, as its definition's family says).

**Outputs** (:class:`Prediction`, per rank count): ``step_s``, ``compute_s`` (forward + backward +
update), ``comm_s`` (network busy time per step), ``exposed_comm_s`` (step - compute),
``comm_share`` (exposed / step), ``wire_bytes`` and ``messages`` (what one rank sends per step),
``speedup`` (weak scaling at a fixed per-rank batch: ``N t1 / tN``, N-1 workers for ``easgd``) and
``efficiency`` (speedup / N). Network models: :mod:`workbench.netsim.costs`.

Pure Python (pandas for tables): no torch, no MPI.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:  # pandas loads where a table is made: the CLI lists PREDICTABLE without it
    import pandas as pd

from ..comm.buckets import bucket_bounds
from ..comm.options import Communication, resolve
from ..optim.definition import Algorithm
from ..optim.registry import ALGORITHMS, UnknownAlgorithm, definition_of
from .costs import network_model
from .exchanges import OUTER_ITEMSIZE as _OUTER_ITEMSIZE, Message, back_to_back, bucket_level, steady
from . import exchanges
from .profile import LayerProfile, check_profile

#: the built-in training algorithms the predictor models: those whose definition declares an exchange
PREDICTABLE = tuple(name for name, spec in ALGORITHMS.items() if spec.exchange is not None)
#: how MPI's native all-reduce moves one float (the fp16/bf16 overflow decision): MPICH uses
#: recursive doubling for small messages
DECISION_COLLECTIVE = "recursive_doubling"
#: the keys of :meth:`Prediction.to_dict` (and of the CLI's JSON rows)
COLUMNS = ("algorithm", "ranks", "step_s", "compute_s", "comm_s", "exposed_comm_s", "comm_share", "wire_bytes",
           "messages", "buckets", "speedup", "efficiency")


class PredictError(ValueError):
    """Arguments the predictor cannot take; the message names the parameter and what is allowed."""


@dataclass
class Prediction:
    """One rank count's prediction (see the module's text for each field); ``timeline``: the
    messages of one (communicating) step."""

    algorithm: str
    ranks: int
    step_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    comm_share: float
    wire_bytes: float
    messages: float
    buckets: int
    speedup: float
    efficiency: float
    timeline: list[Message] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The fields of :data:`COLUMNS` (no timeline)."""
        return {key: value for key, value in asdict(self).items() if key in COLUMNS}


def communication(options: Communication | str | dict | None = None, **fields) -> Communication:
    """The options as a :class:`~workbench.comm.options.Communication`: one, a preset name
    (``"gradientflow"``), a dict of its fields, or None (dense fp32, one message per step), with
    ``fields`` (``fusion_bytes=0``, ...) on top."""
    base = options.to_dict() if isinstance(options, Communication) else resolve(options)
    base.update(fields)
    return Communication(**base)


def _layout(layers: Sequence[LayerProfile]) -> tuple[list[tuple[int, int]], list[int]]:
    """The flat pool's tensor bounds (registration order) and each tensor's layer."""
    bounds, owner, offset = [], [], 0
    for i, layer in enumerate(layers):
        for size in layer.tensor_sizes:
            bounds.append((offset, offset + size))
            owner.append(i)
            offset += size
    return bounds, owner


def _bucket_messages(elements: int, opts: Communication) -> list[tuple[str, int]]:
    """``(what, bytes)`` of the all-reduces one bucket sends, in order (csc_hook's arithmetic)."""
    item = opts.wire_itemsize
    if not opts.sparse:
        return [("gradients", elements * item)]
    c = opts.sparse_chunk
    chunks = -(-elements // c)
    ratio = opts.sparse_ratio
    keep = chunks if ratio >= 1.0 else min(chunks, math.ceil(ratio * chunks))
    if keep == chunks:
        return [("gradients", elements * item)]
    return [("norms", chunks * 4), ("chunks", keep * c * item)]


def definition(algorithm: str | Algorithm) -> Algorithm:
    """The definition of ``algorithm`` (a name, ``module:NAME``, or a definition) if the predictor can
    model it (it declares an exchange); else PredictError."""
    if isinstance(algorithm, Algorithm):
        spec = algorithm
    else:
        try:
            spec = definition_of(algorithm)
        except UnknownAlgorithm:
            raise PredictError(f"algorithm must be one of {', '.join(PREDICTABLE)}; got {algorithm!r}") from None
    if spec.exchange is None:
        raise PredictError(f"algorithm must be one of {', '.join(PREDICTABLE)} (or declare its exchange); "
                           f"{spec.name} declares none")
    return spec


def _check(ranks, spec: Algorithm, tau, update_s, apply_s, skew_s=0.0) -> None:
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise PredictError(f"ranks must be an integer >= 1; got {ranks!r}")
    if spec.master_based and ranks < 2:
        raise PredictError(f"ranks must be >= 2 for {spec.name} (rank 0 is the master); got {ranks}")
    if not isinstance(tau, int) or isinstance(tau, bool) or tau < 1:
        raise PredictError(f"tau must be an integer >= 1 (steps between exchanges); got {tau!r}")
    for name, value in (("update_s", update_s), ("apply_s", apply_s), ("skew_s", skew_s)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
            raise PredictError(f"{name} must be a number of seconds >= 0; got {value!r}")
    if spec.master_based and skew_s:
        raise PredictError(f"skew_s applies to lock-step algorithms (sync-sgd, sync-easgd); {spec.name}'s workers "
                           "do not wait for each other")


def _check_periodic(spec: Algorithm, every: int, fragments, sync_delay, outer_wire_dtype, tensors: int) -> None:
    if (fragments, sync_delay, outer_wire_dtype) == (1, 0, "fp32"):
        return
    if not spec.outer_optimizer:
        raise PredictError(f"fragments, sync_delay and outer_wire_dtype apply to diloco and streaming-diloco; got "
                           f"algorithm={spec.name!r}")
    if outer_wire_dtype not in _OUTER_ITEMSIZE:
        raise PredictError(f"outer_wire_dtype must be one of {', '.join(_OUTER_ITEMSIZE)}; got {outer_wire_dtype!r}")
    if (fragments, sync_delay) != (1, 0) and not spec.streaming:
        raise PredictError("fragments and sync_delay apply to streaming-diloco")
    if not isinstance(fragments, int) or not 1 <= fragments <= min(tensors, every):
        raise PredictError(f"fragments must be an integer in 1..{min(tensors, every)} (parameter tensors, "
                           f"sync_every); got {fragments!r}")
    if not isinstance(sync_delay, int) or not 0 <= sync_delay < every // fragments:
        raise PredictError(f"sync_delay must be an integer in 0..{every // fragments - 1} (< sync_every // "
                           f"fragments); got {sync_delay!r}")


def predict(profile: Sequence[LayerProfile], ranks: int, network=None, options=None, collective: str | None = None,
            algorithm: str | Algorithm = "sync-sgd", tau: int = 1, update_s: float = 0.0, apply_s: float = 0.0,
            skew_s: float = 0.0, fragments: int = 1, sync_delay: int = 0, outer_wire_dtype: str = "fp32",
            **fields) -> Prediction:
    """Predict one step of ``algorithm`` on ``ranks`` ranks.

    ``network``: a model of :mod:`~workbench.netsim.costs` (default :class:`~workbench.netsim.costs.
    AlphaBeta`: ring, 56 Gbit/s, 5 us per step) or a ``Calibration``; ``collective`` replaces its
    schedule. ``options`` and ``fields``: the gradient-communication options (:func:`communication`).
    ``tau``: steps between EASGD exchanges (the periodic algorithms' ``sync_every``); ``fragments``,
    ``sync_delay``, ``outer_wire_dtype``: Streaming DiLoCo's (the last DiLoCo's too); ``update_s``: seconds of the optimizer update per step;
    ``apply_s``: seconds the EASGD master spends applying one worker's weights; ``skew_s``: the
    slowest rank's extra forward + backward seconds (see the module's text on stragglers).
    """
    layers = check_profile(profile)
    spec = definition(algorithm)
    algorithm, kind = spec.name, spec.exchange
    _check(ranks, spec, tau, update_s, apply_s, skew_s)
    bounds, owner = _layout(layers)
    _check_periodic(spec, tau, fragments, sync_delay, outer_wire_dtype, len(bounds))
    opts = communication(options, **fields)
    if kind != "gradients" and (opts.sparse or opts.wire_dtype != "fp32"):
        raise PredictError(f"{algorithm} exchanges weights, not gradients: wire_dtype and sparse_ratio do not "
                           f"apply (leave them fp32 / None; they are sync-sgd's)")
    if kind == "round-robin" and opts.fusion_bytes is not None:
        raise PredictError(f"{algorithm} sends its weights as one message: fusion_bytes does not apply (leave it None)")
    net = network_model(network, collective)
    forward = sum(l.forward_s for l in layers)
    backward = sum(l.backward_s for l in layers)
    local = forward + backward + update_s
    buckets = bucket_bounds(bounds, opts.fusion_bytes)
    skew_s = skew_s if ranks > 1 else 0.0
    if kind == "round-robin":
        model = sum(l.parameters for l in layers) * 4
        return _result(algorithm, ranks, exchanges.easgd(model, ranks, net, tau, local, apply_s))
    if kind == "weights":
        return _result(algorithm, ranks, exchanges.sync_easgd(buckets, ranks, net, opts.overlap, tau,
                                                              forward + backward, update_s, skew_s))
    if kind in ("average", "outer", "streaming"):
        return _result(algorithm, ranks, exchanges.periodic(
            kind, bounds, ranks, net, opts.fusion_bytes, tau, forward + backward + skew_s, update_s, fragments,
            sync_delay, outer_wire_dtype if spec.outer_optimizer else "fp32"))
    slow = 1.0 + skew_s / (forward + backward) if forward + backward > 0 else 1.0   # the slowest rank
    ready_at, t = [0.0] * len(layers), forward
    for i in reversed(range(len(layers))):
        t += layers[i].backward_s
        ready_at[i] = t * slow
    computed = forward + backward + skew_s   # the slowest rank's backward end: the step waits for it
    timeline, free = _steady_messages(buckets, ranks, net, opts, ready_at, owner, computed, update_s)
    end = max(computed, free)
    if ranks > 1 and opts.wire_dtype != "fp32":
        seconds = net.with_collective(DECISION_COLLECTIVE).allreduce(4, ranks)
        timeline.append(Message("decision", -1, 4, round(2 * (ranks - 1) / ranks * 4), end, end + seconds))
        end += seconds
    return _result(algorithm, ranks, exchanges.Exchange(end + update_s, local, timeline, len(buckets), ranks, 1))


def predict_config(cfg, profile: Sequence[LayerProfile], network=None, **timings) -> Prediction:
    """:func:`predict` for a :class:`~workbench.config.RunConfig` as it would run: its algorithm
    (its definition says the model), ranks, collective, gradient-communication options, and its
    period and fragments where its definition takes them. ``timings``: ``update_s``, ``apply_s``,
    ``skew_s`` (seconds this machine spends that the profile does not hold)."""
    spec = definition(cfg.spec)
    comm = cfg.communication_options
    kwargs = {"tau": getattr(cfg, spec.period) if spec.period and spec.uses(spec.period) else 1}
    for name in ("fragments", "sync_delay", "outer_wire_dtype"):
        if spec.uses(name):
            kwargs[name] = getattr(cfg, name)
    collective = cfg.collective if spec.uses("collective") and cfg.collective != "native" else None
    return predict(profile, cfg.ranks, network, comm, collective, algorithm=spec, **kwargs, **timings)


def _steady_messages(buckets, ranks: int, net, opts: Communication, ready_at: list[float], owner: list[int],
                     computed: float, update_s: float) -> tuple[list[Message], float]:
    """:func:`_sync_sgd_messages` in the steady state of a link with a burst (``AlphaBeta.burst``):
    its bucket refills while the link is idle, from the last message of one step to the first of
    the next (the update, the forward, the backward before it) (:func:`~.exchanges.steady`)."""
    def exchange(tokens):
        return _sync_sgd_messages(buckets, ranks, net, opts, ready_at, owner, computed, bucket_level(tokens, 0, net))

    def idle(result):
        timeline, free = result
        return [max(computed, free) - free + update_s + (timeline[0].start if timeline else 0.0)]

    return steady(exchange, idle, net, ranks)


def _sync_sgd_messages(buckets, ranks: int, net, opts: Communication, ready_at: list[float], owner: list[int],
                       computed: float, tokens: float) -> tuple[list[Message], float]:
    """Sync-SGD's messages in one step and when the network is free after them. ``tokens``: the
    link's burst bucket when the step's first message starts (0: none; see ``AlphaBeta.burst``),
    refilled at the link's rate in the gaps between messages."""
    timeline: list[Message] = []
    free = 0.0   # when the network is next free
    burst = getattr(net, "burst", 0.0)
    if ranks > 1:
        for k, (start, stop, params) in enumerate(buckets):
            begin = max(ready_at[owner[p]] for p in params) if opts.overlap else computed
            if timeline and burst:
                tokens = min(burst, tokens + (max(begin, free) - free) * net.bandwidth)
            messages = [(what, k, nbytes) for what, nbytes in _bucket_messages(stop - start, opts)]
            sent, free, tokens = back_to_back(messages, ranks, net, max(begin, free), tokens)
            timeline += sent
    return timeline, free


def _result(algorithm: str, ranks: int, e: exchanges.Exchange) -> Prediction:
    comm = sum(m.end - m.start for m in e.timeline) / e.per
    exposed = max(e.step - e.compute, 0.0)
    speedup = e.workers * e.compute / e.step if e.step > 0 else float(e.workers)
    return Prediction(algorithm, ranks, e.step, e.compute, comm, exposed, exposed / e.step if e.step > 0 else 0.0,
                      sum(m.sent for m in e.timeline) / e.per, len(e.timeline) / e.per, e.buckets, speedup,
                      speedup / ranks, e.timeline)


def scaling(profile: Sequence[LayerProfile], ranks_list: Iterable[int], network=None, options=None,
            collective: str | None = None, algorithm: str = "sync-sgd", **kwargs) -> pd.DataFrame:
    """:func:`predict` for each rank count: a DataFrame with the columns :data:`COLUMNS`."""
    ranks_list = list(ranks_list)
    if not ranks_list:
        raise PredictError("ranks_list must name at least one rank count")
    net = network_model(network, collective)   # one model (and one simulator cache) for every row
    rows = [predict(profile, n, net, options, algorithm=algorithm, **kwargs).to_dict() for n in ranks_list]
    import pandas as pd
    return pd.DataFrame(rows, columns=list(COLUMNS))


def compare(profile: Sequence[LayerProfile], ranks_list: Iterable[int], setups: dict[str, dict],
            network=None, **kwargs) -> pd.DataFrame:
    """Speed-up and efficiency of several option sets side by side: ``setups`` maps a label to
    :func:`predict`'s keyword arguments (options, algorithm, collective, ...); one row per rank
    count, columns ``(label, speedup)``, ``(label, efficiency)``, ``(label, comm_share)``."""
    ranks_list = list(ranks_list)
    frames = {}
    for label, setup in setups.items():
        frame = scaling(profile, ranks_list, network, **{**kwargs, **setup}).set_index("ranks")
        frames[label] = frame[["speedup", "efficiency", "comm_share"]]
    import pandas as pd
    return pd.concat(frames, axis=1)


def easgd_shares(profile: Sequence[LayerProfile], ranks: Sequence[int] = (4, 16), network=None, tau: int = 1,
                 update_s: float = 0.0, apply_s: float = 0.0, fusion_bytes: int | None = None) -> pd.DataFrame:
    """The SC'17 comparison: a worker's communication share under the original EASGD
    (round-robin master, no overlap) and Sync EASGD (weights all-reduced, without and with
    overlap), per rank count. Columns: algorithm, overlap, ranks, step_s, comm_s, comm_share,
    speedup, efficiency."""
    setups = (("easgd", False), ("sync-easgd", False), ("sync-easgd", True))
    rows = []
    for n in ranks:
        for algorithm, overlap in setups:
            fusion = None if definition(algorithm).exchange == "round-robin" else fusion_bytes  # one message
            p = predict(profile, n, network, algorithm=algorithm, tau=tau, update_s=update_s, apply_s=apply_s,
                        overlap=overlap, fusion_bytes=fusion)
            rows.append({"algorithm": algorithm, "overlap": overlap, "ranks": n, "step_s": p.step_s,
                         "comm_s": p.comm_s, "comm_share": p.comm_share, "speedup": p.speedup,
                         "efficiency": p.efficiency})
    import pandas as pd
    return pd.DataFrame(rows)
