"""What a finished run reports: the statuses a run can have, the fields of ``summary.json``
(:class:`Summary`), and the figures computed from a run's parts, each in one place: the steps a
run takes (:func:`planned_steps`) and the summary itself (:func:`build_summary`, from the
ranks' :class:`RankReport`).

Pure (standard library and the :mod:`workbench.telemetry` leaf): rank 0 builds the summary
(:mod:`workbench.runtime.rank.worker`); the notebook's ``RunResult``, the results store's
summary columns (:data:`STORE_COLUMNS`) and the CLI (:data:`PRINTED_KEYS`) read it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, TypedDict

from .telemetry import CATEGORIES, busy_seconds, comm_fraction, exposed_comm_seconds

if TYPE_CHECKING:
    from .config import RunConfig

#: a run's life: ``running`` until it ends ``finished``, ``failed`` or ``cancelled``
STATUSES = ("running", "finished", "failed", "cancelled")


class Summary(TypedDict, total=False):
    """``summary.json``: what rank 0 writes when a run ends (finished or cancelled).

    A dict at run time (``RunResult.summary``, JSON in the store); this names its keys and types.
    Times are seconds, sizes bytes, shares fractions in [0, 1]. Every summary holds ``algorithm``, ``ranks``,
    ``config``, ``final_test_accuracy``, ``final_loss``, ``wall_seconds``, ``steps``, ``comm_fraction`` and
    ``bytes_sent`` (:data:`CONTRACT_KEYS`), a synchronous algorithm's ``weights_checksum`` too; another key
    that does not apply to a run may be missing.

    Attributes:
        algorithm: the training algorithm's name.
        ranks: the MPI ranks, the master included.
        workers: ranks that train: all, or all but the master.
        cancelled: stopped early by ``cancel()``.
        config: the :class:`~workbench.config.RunConfig` as a dict.
        hyper: ``lr``, ``momentum`` and ``rho`` as the run used them (``RunConfig.hyper``).
        communication: the gradient-communication options as the run used them.
        final_test_accuracy: of the final weights (center / master's weights / model), in [0, 1].
        final_test_loss: of the final weights.
        final_loss: mean train loss of the last ``workers * 5`` steps.
        wall_seconds: training time from the ranks' common start, longest rank (a run that came back from
            faults: the whole run on its clock).
        setup_seconds: imports, data and model set-up before it, longest rank.
        steps: training steps taken, summed over the workers.
        steps_per_worker: the most steps one worker took.
        comm_fraction: ``telemetry.comm_fraction``, mean over ranks (None: telemetry off).
        comm_fraction_workers: the same over the ranks that train.
        time_in: seconds in each span category and ``exposed_comm``, mean over ranks.
        bytes_sent: deprecated (one release): ``wire_bytes`` summed over the ranks (after faults: over every
            incarnation).
        wire_bytes: bytes one rank put on the wire over the whole run, averaged over ranks (from each rank's
            byte counter, telemetry on or off; after faults: the last incarnation's, as the fields below).
        dense_wire_bytes: what dense fp32 with the same algorithm and collective would have sent.
        messages: messages one rank sent (all-reduce calls, CSC norms included; point-to-point sends).
        wire_bytes_per_step: ``wire_bytes / steps_per_worker``.
        messages_per_step: ``messages / steps_per_worker``.
        compression_ratio: ``dense_wire_bytes / wire_bytes`` (None: nothing sent).
        skipped_steps: steps every rank skipped (an fp16/bf16 overflow on the wire).
        parameters: the model's parameters.
        weights_checksum: sha256 of the final weights: synchronous algorithms only.
        evaluations: evaluation points during training (the final one not counted).
        memory_per_rank: per rank, ``data_bytes`` (its shard and test rows) and ``max_rss_bytes``.
        restarts: a run that came back from faults (``max_restarts``): one dict per fault, with
            ``incarnation``, ``detected`` (unix seconds), ``rank``, ``cause``, ``resumed_from_step``,
            ``nodes_lost``, ``world_size`` (of the next incarnation), ``recovery_seconds`` and ``bytes_sent``
            (by the incarnation that failed, as its ranks' records had it).
        incarnations: 1 + the restarts.
        world_sizes: the ranks of each incarnation, in order.
        workers_lost: workers a master served on without (``rank``, ``node``, ``cause``): no restart.
    """

    algorithm: str
    ranks: int
    workers: int                     # ranks that train: all, or all but the master
    cancelled: bool                  # stopped early by ``cancel()``
    config: dict[str, Any]           # the RunConfig as a dict
    hyper: dict[str, float]          # lr, momentum and rho as the run used them (RunConfig.hyper)
    communication: dict[str, Any]    # the gradient-communication options as the run used them
    final_test_accuracy: float       # of the final weights (center / master's weights / model)
    final_test_loss: float
    final_loss: float | None         # mean train loss of the last ``workers * 5`` steps
    wall_seconds: float              # training time from the ranks' common start, longest rank
    setup_seconds: float             # imports, data and model set-up before it, longest rank
    steps: int                       # training steps taken, summed over the workers
    steps_per_worker: int            # the most steps one worker took
    comm_fraction: float | None      # telemetry.comm_fraction, mean over ranks (None: telemetry off)
    comm_fraction_workers: float | None  # the same over the ranks that train
    time_in: dict[str, float]        # seconds in each span category and exposed_comm, mean over ranks
    bytes_sent: int                  # deprecated (one release): wire_bytes summed over the ranks
    # traffic from each rank's one byte counter (workbench.comm.hooks.Traffic; telemetry on or
    # off), per rank averaged over ranks
    wire_bytes: float                # bytes one rank put on the wire over the whole run
    dense_wire_bytes: float          # what dense fp32 with the same algorithm and collective would have sent
    messages: float                  # messages (all-reduce calls, CSC norms included; point-to-point sends)
    wire_bytes_per_step: float       # wire_bytes / steps_per_worker
    messages_per_step: float         # messages / steps_per_worker
    compression_ratio: float | None  # dense_wire_bytes / wire_bytes (None: nothing sent)
    skipped_steps: int               # steps every rank skipped (an fp16/bf16 overflow on the wire)
    parameters: int                  # model parameters
    weights_checksum: str            # sha256 of the final weights: synchronous algorithms only
    evaluations: int                 # evaluation points during training (the final one not counted)
    memory_per_rank: list[dict[str, int]]  # per rank: data_bytes (its shard and test rows), max_rss_bytes
    # a run that came back from faults (``max_restarts``; written by the batch run that launched it)
    # (``wall_seconds`` then spans the whole run on its clock and ``bytes_sent`` every incarnation; the per-rank
    # traffic fields above are the last incarnation's)
    restarts: list[dict[str, Any]]   # per fault: incarnation, detected (epoch s), rank, cause, resumed_from_step,
    #                                  nodes_lost, world_size (of the next incarnation), recovery_seconds,
    #                                  bytes_sent (by the incarnation that failed, as its ranks' records had it)
    incarnations: int                # 1 + the restarts
    world_sizes: list[int]           # the ranks of each incarnation, in order
    workers_lost: list[dict[str, Any]]  # workers a master served on without (rank, node, cause): no restart


#: The keys every ``summary.json`` holds (docs/architecture.md, "Public contracts"); synchronous algorithms add
#: ``weights_checksum``.
CONTRACT_KEYS = ("algorithm", "ranks", "config", "final_test_accuracy", "final_loss", "wall_seconds",
                 "steps", "comm_fraction", "bytes_sent")
#: Summary fields the results store shows as columns of ``Store.runs()``, with their type.
STORE_COLUMNS: dict[str, type] = {"final_test_accuracy": float, "final_loss": float, "wall_seconds": float,
                                  "comm_fraction": float, "steps": int, "bytes_sent": int,
                                  "wire_bytes": float, "dense_wire_bytes": float, "messages": float,
                                  "incarnations": int}
#: Summary fields ``workbench train`` prints, in order (those a summary has).
PRINTED_KEYS = ("algorithm", "ranks", "final_test_accuracy", "final_loss", "wall_seconds", "steps",
                "comm_fraction", "bytes_sent", "wire_bytes_per_step", "messages_per_step", "compression_ratio",
                "weights_checksum")


def planned_steps(train_samples: int, workers: int, batch_size: int, epochs: int,
                  synchronous: bool = False) -> list[int]:
    """The training steps each worker takes in a whole run (index = worker), the one place a
    run's step count is computed: worker ``w`` holds training samples ``w, w + workers, ...``
    (:func:`workbench.data.shard_indices`) and takes ``len(shard) // batch_size`` steps an epoch
    (:class:`workbench.data.Batches`); a run takes ``sum(planned_steps(...))`` steps.

    ``synchronous``: lock-step algorithms all-reduce at every step, so every worker takes as
    many steps as the smallest shard gives (shards differ by one sample, and a step more on one
    rank would wait for partners that have finished)."""
    per_epoch = [len(range(w, train_samples, workers)) // batch_size for w in range(workers)]
    if synchronous:
        per_epoch = [min(per_epoch)] * workers
    return [n * epochs for n in per_epoch]


def status_of(summary: Summary | None) -> str:
    """A run's status from its summary: ``failed`` without one, else ``cancelled`` or ``finished``."""
    if summary is None:
        return "failed"
    return "cancelled" if summary.get("cancelled") else "finished"


class RankReport(TypedDict):
    """What one rank tells rank 0 when training ends (:func:`rank_report`)."""

    rank: int
    wall: float            # seconds from the common start to the end of its training loop
    setup: float           # seconds before the common start
    time_in: dict[str, float]  # seconds in each span category, and exposed_comm
    comm_fraction: float   # telemetry.comm_fraction of its spans
    steps: int             # training steps taken (0 on a master)
    cancelled: bool
    traffic: dict[str, int]  # wire_bytes, dense_wire_bytes, messages, skipped_steps (Context.traffic)
    memory: dict[str, int]   # data_bytes (the data set rows it holds), max_rss_bytes (peak resident memory)
    metrics: list[dict]
    events: list[dict]


#: the keys of a rank's traffic counters
TRAFFIC_KEYS = ("wire_bytes", "dense_wire_bytes", "messages", "skipped_steps")


def rank_report(rank: int, wall: float, setup: float, steps: int, cancelled: bool, metrics: list[dict],
                events: list[dict], traffic: dict[str, int] | None = None,
                memory: dict[str, int] | None = None) -> RankReport:
    """One rank's report. ``traffic``: the rank's counters, the one byte counter included
    (:attr:`~workbench.runtime.rank.context.Context.traffic`); ``memory``: its data bytes and peak
    resident bytes."""
    time_in = {cat: busy_seconds(events, (cat,)) for cat in CATEGORIES}
    time_in["exposed_comm"] = exposed_comm_seconds(events)
    return {"rank": rank, "wall": wall, "setup": setup, "time_in": time_in,
            "comm_fraction": comm_fraction(events, wall), "steps": steps, "cancelled": cancelled,
            "traffic": {key: int((traffic or {}).get(key, 0)) for key in TRAFFIC_KEYS},
            "memory": {key: int((memory or {}).get(key, 0)) for key in ("data_bytes", "max_rss_bytes")},
            "metrics": metrics, "events": events}


def build_summary(cfg: "RunConfig", reports: list[RankReport], final_eval: dict, parameters: int,
                  weights_checksum: str | None = None) -> Summary:
    """The run's :class:`Summary` from every rank's report and the final evaluation.

    ``steps`` is the sum of the workers' steps (a master takes none); ``comm_fraction`` the
    mean of the ranks' :func:`~workbench.telemetry.comm_fraction` (None when telemetry is off).
    """
    train = [m for r in reports for m in r["metrics"] if m["kind"] == "train"]
    last_steps = sorted(train, key=lambda m: m["step"])[-max(1, cfg.workers * 5):]
    summary: Summary = {
        "algorithm": cfg.algorithm, "ranks": cfg.ranks, "workers": cfg.workers,
        "cancelled": any(r["cancelled"] for r in reports),
        "config": cfg.to_dict(),
        "hyper": cfg.hyper._asdict(),  # lr, momentum, rho as the run used them (config keeps None for defaults)
        "communication": cfg.communication_options.to_dict(),  # the preset merged with the options given
        "final_test_accuracy": final_eval["test_accuracy"],
        "final_test_loss": final_eval["test_loss"],
        "final_loss": sum(m["loss"] for m in last_steps) / len(last_steps) if last_steps else None,
        "wall_seconds": max(r["wall"] for r in reports),  # training, from the common start
        "setup_seconds": max(r["setup"] for r in reports),
        "steps": sum(r["steps"] for r in reports),
        "steps_per_worker": max(r["steps"] for r in reports),
        "comm_fraction": _mean(r["comm_fraction"] for r in reports) if cfg.telemetry else None,
        "comm_fraction_workers": _mean(r["comm_fraction"] for r in reports if r["steps"] > 0)
        if cfg.telemetry else None,
        "time_in": {cat: _mean(r["time_in"][cat] for r in reports) for cat in (*CATEGORIES, "exposed_comm")},
        "bytes_sent": sum(int(r["traffic"]["wire_bytes"]) for r in reports),  # deprecated: wire_bytes x ranks
        "parameters": parameters,
    }
    summary.update(traffic_summary(reports, summary["steps_per_worker"]))
    if weights_checksum is not None:
        summary["weights_checksum"] = weights_checksum
    summary["memory_per_rank"] = [{"rank": r["rank"], **r.get("memory", {})} for r in reports]
    summary["evaluations"] = sum(1 for r in reports for m in r["metrics"] if m["kind"] == "eval" and not m.get("final"))
    return summary


def traffic_summary(reports: list[RankReport], steps_per_worker: int) -> dict[str, Any]:
    """The traffic fields of :class:`Summary`: per rank, averaged over ranks (a master's
    replies count like a worker's pushes), and per step of a worker."""
    mean = {key: _mean(r["traffic"][key] for r in reports) for key in TRAFFIC_KEYS}
    steps = max(steps_per_worker, 1)
    return {"wire_bytes": mean["wire_bytes"], "dense_wire_bytes": mean["dense_wire_bytes"],
            "messages": mean["messages"], "wire_bytes_per_step": mean["wire_bytes"] / steps,
            "messages_per_step": mean["messages"] / steps,
            "compression_ratio": mean["dense_wire_bytes"] / mean["wire_bytes"] if mean["wire_bytes"] else None,
            "skipped_steps": max(r["traffic"]["skipped_steps"] for r in reports)}


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)
