"""Run a burst-parallel :class:`~workbench.burst.plan.BurstPlan` for real over MPI and time it.

A plan's layer ``i`` is ``model[i]``, the i-th top-level child of a chain model (``mlp``,
``wide_mlp``, ``cnn`` of :func:`workbench.models.build`, on digits). Consecutive layers on the
same ranks (so the same sample shares) form a *segment*, one autograd graph. Between segments the
activations are redistributed point to point: each rank of the next segment gets, from each rank
of the previous one, the rows of its samples that rank holds (its own rows it copies); backward
sends the activation gradients back along the same routes. A rank's loss is its rows' summed cross
entropy over the global batch size, so a segment's gradients summed over its ranks (one
``MPI_Iallreduce`` per segment on its sub-communicator, issued when its backward ends, waited
after the last one) are the gradient of the mean loss over the global batch: plain SGD follows.
Every wait polls nonblocking requests against a deadline (``wait_timeout``): a rank whose peer
never comes raises ``TimeoutError`` naming itself and the ranks it waited on; under ``python -m
mpi4py`` a rank that raises calls ``MPI_Abort``, which ends the others at once.

    result = execute(plan, "cnn", steps=20)  # bad plan: BurstError before launch; result["weights"]
    reference("cnn", plan.batch, 20, lr=0.05, seed=0)  # the single-process run, same batches

Ranks run ``python -m mpi4py -m workbench.burst.execute --plan P.json --model cnn --steps S --out
R.json`` (rank 0 writes ``R.json``, weights in ``R.npy``); the launcher never imports mpi4py.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from collections import namedtuple
from pathlib import Path

import numpy as np

from ..checks import integer
from ..deadline import poll
from .graph import BurstError
from .plan import BurstPlan, sample_ranges
from .reference import NUM_CLASSES, NUM_FEATURES, batch_loss, batches, initial_model, sgd_step
from .reference import reference  # noqa: F401 (the notebook and the tests import it from here)

DTYPES = ("float32", "float64")
ROOT = Path(__file__).resolve().parents[2]  # the folder holding the workbench package
_FWD, _BWD = 1, 2  # tag = kind + 4 * boundary
#: keyword options of :func:`run_plan` and :func:`execute`, with their defaults
OPTIONS = {"lr": 0.05, "seed": 0, "momentum": 0.0, "warmup": 3, "dtype": "float32", "wait_timeout": 60.0,
           "fail": None}
#: a wait spins (yielding) this long, then naps between polls: waiting ranks leave the cores to busy
#: ones when ranks outnumber cores (4 ranks, 2 cores: cnn all at 1 took 8 ms spinning, 2.6 napping)
SPIN_S, NAP_S = 2e-4, 5e-5


class ExecuteError(RuntimeError):
    """A rank failed or the job timed out: the first line names the rank (``rank``) and why."""

    def __init__(self, message: str, rank: int | None, output: str = "") -> None:
        super().__init__(message)
        self.rank, self.output = rank, output


#: layers ``first..last`` (inclusive) on ``ranks``, rank ``ranks[i]`` holding the ``samples[i]`` rows
Segment = namedtuple("Segment", "first last ranks samples")


def segments(plan: BurstPlan, model_name: str, nranks: int) -> list[Segment]:
    """The plan checked against the model and ``nranks`` (else :class:`BurstError` naming the
    layer), as segments. Missing ``samples`` are the equal shares of :func:`sample_ranges`."""
    integer("plan batch", plan.batch, 1, BurstError)
    from ..models import build
    n = len(build(model_name, NUM_FEATURES, NUM_CLASSES))
    layers = sorted(plan.layers, key=lambda l: l.id)
    if [l.id for l in layers] != list(range(n)):
        raise BurstError(f"model {model_name!r} has layers 0..{n - 1}; the plan has {[l.id for l in layers]}")
    out: list[Segment] = []
    for l in layers:
        ranks = tuple(int(r) for r in l.ranks)
        if l.gpus != len(ranks) or len(set(ranks)) != len(ranks):
            raise BurstError(f"layer {l.id}: {l.gpus} GPUs but ranks {list(ranks)} (distinct ranks, one per GPU)")
        if any(not 0 <= r < nranks for r in ranks):
            raise BurstError(f"layer {l.id}: ranks {list(ranks)} outside 0..{nranks - 1} ({nranks} ranks)")
        try:
            shares = sample_ranges(plan.batch, l.gpus)
        except BurstError as exc:  # not divisible: unequal shares
            raise BurstError(f"layer {l.id}: {exc}") from None
        if l.samples and [tuple(s) for s in l.samples] != shares:
            raise BurstError(f"layer {l.id}: samples {[list(s) for s in l.samples]} are not the equal "
                             f"contiguous shares {[list(s) for s in shares]} of batch {plan.batch}")
        if out and out[-1].ranks == ranks:
            out[-1] = Segment(out[-1].first, l.id, ranks, out[-1].samples)
        else:
            out.append(Segment(l.id, l.id, ranks, tuple(shares)))
    return out


# -- rank side --------------------------------------------------------------------------------
def _route(me: int, src: Segment, dst: Segment):
    """Rows moving from ``src``'s layout to ``dst``'s, as seen by rank ``me``: sends ``(peer, lo,
    hi)`` in my src rows, receives ``(peer, lo, hi)`` in my dst rows, local copies ``(slo, shi,
    dlo, dhi)``."""
    sends, recvs, local = [], [], []
    for s, (sa, sb) in zip(src.ranks, src.samples):
        for d, (da, db) in zip(dst.ranks, dst.samples):
            a, b = max(sa, da), min(sb, db)
            if a >= b or me not in (s, d):
                continue
            if s == d:
                local.append((a - sa, b - sa, a - da, b - da))
            elif s == me:
                sends.append((d, a - sa, b - sa))
            else:
                recvs.append((s, a - da, b - da))
    return sends, recvs, local


def _wait(pairs, timeout: float, me: int, what: str) -> None:
    """Poll ``(pending, peer)`` pairs (MPI requests or :class:`workbench.comm.Handle` s) until all
    complete; ``TimeoutError`` naming the peers still pending after ``timeout`` s."""
    from ..comm import Handle
    if not pairs:
        return

    def complete(pending) -> bool:
        return pending.test() if isinstance(pending, Handle) else pending.Test()

    def expired() -> TimeoutError:
        late = sorted({str(p) for r, p in pairs if not complete(r)})
        return TimeoutError(f"rank {me}: {what} did not complete within {timeout:g} s; "
                            f"still waiting on rank(s) {', '.join(map(str, late))}")
    poll(lambda: all([complete(r) for r, _ in pairs]), timeout, expired, spin=SPIN_S, nap=NAP_S)


def _move(comm, route, src_rows, rows: int, shape, dtype, tag: int, timeout: float, what: str):
    """Redistribute along ``route``; my ``rows`` rows of the destination layout (None if none)."""
    import torch
    sends, recvs, local = route
    out = torch.empty((rows, *shape), dtype=dtype) if rows else None
    pairs = [(comm.Irecv(out[lo:hi].numpy(), source=peer, tag=tag), peer) for peer, lo, hi in recvs]
    src_rows = src_rows.contiguous() if sends else src_rows
    pairs += [(comm.Isend(src_rows[lo:hi].numpy(), dest=peer, tag=tag), peer) for peer, lo, hi in sends]
    for slo, shi, dlo, dhi in local:
        out[dlo:dhi] = src_rows[slo:shi]
    _wait(pairs, timeout, comm.Get_rank(), what)
    return out


class _Rank:
    """This rank's part of a plan: its segments' modules and flat weights, its rows of each
    segment's samples, the routes between segments and a sub-communicator per rank set."""

    def __init__(self, plan: BurstPlan, model_name: str, comm, seed: int, dtype: str, wait_timeout: float):
        import torch
        from mpi4py import MPI

        from ..comm import NATIVE, iallreduce
        from ..models import FlatParams
        self.me, size, self.timeout = comm.Get_rank(), comm.Get_size(), wait_timeout
        self.segs = segs = segments(plan, model_name, size)
        self.dtype, self.batch, self.last = getattr(torch, dtype), plan.batch, len(segs) - 1
        model = initial_model(model_name, seed, dtype)
        x, self.shapes = torch.zeros(1, NUM_FEATURES, dtype=self.dtype), []  # each segment's output per sample
        for s in segs:
            x = model[s.first:s.last + 1](x).detach()
            self.shapes.append(tuple(x.shape[1:]))
        # start-up skew (imports on a loaded machine) is no failure: a longer wait before the set-up collectives
        _wait([(comm.Ibarrier(), f"0..{size - 1}")], max(wait_timeout, 60.0), self.me, "the start barrier")
        self.comm, self.subs = comm.Dup(), {}  # this run's messages never meet the caller's
        for s in segs:  # one sub-communicator per distinct rank set of width > 1, created once
            if len(s.ranks) > 1 and s.ranks not in self.subs:
                mine = self.me in s.ranks
                sub = self.comm.Split(0 if mine else MPI.UNDEFINED, s.ranks.index(self.me) if mine else 0)
                self.subs[s.ranks] = sub if mine else None
                if mine:  # iallreduce's first use on a communicator is collective: here, not mid-step
                    _wait([(iallreduce(torch.zeros(1), sub, NATIVE), "/".join(map(str, s.ranks)))],
                          max(wait_timeout, 60.0), self.me, "the first all-reduce")
        self.mine = [k for k, s in enumerate(segs) if self.me in s.ranks]
        self.modules = {k: model[segs[k].first:segs[k].last + 1] for k in self.mine}  # slices share the layers
        self.flats = {k: FlatParams(self.modules[k]) for k in self.mine}  # weights and gradients, flat
        self.bufs = {k: torch.zeros_like(self.flats[k].data) for k in self.mine}
        self.starts, self.stops = zip(*[s.samples[s.ranks.index(self.me)] if self.me in s.ranks else (0, 0)
                                        for s in segs])
        self.rows = [b - a for a, b in zip(self.starts, self.stops)]
        self.routes = [None] + [(_route(self.me, segs[k - 1], segs[k]), _route(self.me, segs[k], segs[k - 1]))
                                for k in range(1, self.last + 1)]
        self.clock = [0.0, 0.0, 0.0, 0.0]  # this step's start; its compute, transfer and sync seconds
        self.acts: dict = {}  # segment -> (its input, its output) between forward and backward
        self.losses: list[float] = []  # per step, my rows' share of the mean loss (if I hold the last segment)

    def lap(self, i: int) -> None:
        """Charge the time since the last lap to compute (1), transfer (2) or sync (3)."""
        self.clock[i] += time.perf_counter() - sum(self.clock)

    def forward(self, step: int, X, y):
        """Forward through my segments (receiving and sending activations); the loss of my rows of
        the last segment (also kept in :attr:`losses`), None if I hold none."""
        x, loss = None, None
        for k, seg in enumerate(self.segs):
            if k == 0:
                x = X[self.starts[0]:self.stops[0]] if self.rows[0] else None
            else:
                x = _move(self.comm, self.routes[k][0], x, self.rows[k], self.shapes[k - 1], self.dtype,
                          _FWD + 4 * k, self.timeout, f"forward transfer into layer {seg.first} at step {step}")
                self.lap(2)
            if self.rows[k]:
                out = self.modules[k](x.requires_grad_(k > 0))
                self.acts[k], x = (x, out), out.detach()
                if k == self.last:
                    loss = batch_loss(out, y[self.starts[k]:self.stops[k]], self.batch)
                    self.losses.append(loss.item())
                self.lap(1)
        return loss

    def backward(self, step: int, loss) -> list:
        """Backward through my segments (returning activation gradients), each segment's gradient
        all-reduce issued when its backward ends; the ``(handle, ranks)`` pairs to wait for."""
        from ..comm import NATIVE, iallreduce
        reductions, grad = [], None
        for k in range(self.last, -1, -1):
            if self.rows[k]:
                x, out = self.acts.pop(k)
                if k == self.last:
                    loss.backward()
                elif out.requires_grad:  # d(sum(out * grad))/d(out) is grad, exactly; out.backward(grad)
                    (out * grad).sum().backward()  # would import sympy (1.4 s a process, torch 2.13)
                grad = x.grad if k > 0 else None
                sub = self.subs.get(self.segs[k].ranks)
                if sub is not None and self.flats[k].grad.numel():
                    reductions.append((iallreduce(self.flats[k].grad, sub, NATIVE),
                                       "/".join(map(str, self.segs[k].ranks))))  # any member may be late
                self.lap(1)
            if k > 0:
                grad = _move(self.comm, self.routes[k][1], grad, self.rows[k - 1], self.shapes[k - 1], self.dtype,
                             _BWD + 4 * k, self.timeout, f"backward transfer out of layer {self.segs[k].first} "
                                                         f"at step {step}")
                self.lap(2)
        return reductions

    def update(self, lr: float, momentum: float) -> None:
        for k in self.mine:
            sgd_step(self.flats[k].data, self.flats[k].grad, self.bufs[k], lr, momentum)
            self.flats[k].zero_grad()

    def gather(self, record: dict) -> list[dict] | None:
        """Every rank's ``record`` on rank 0 (None elsewhere), after a barrier; the communicators freed."""
        size = self.comm.Get_size()
        _wait([(self.comm.Ibarrier(), f"0..{size - 1}")], self.timeout, self.me, "the final barrier")
        everyone = self.comm.gather(record, root=0)  # every rank is here: cannot hang
        for sub in [*self.subs.values(), self.comm]:
            if sub is not None:
                sub.Free()
        return everyone


def run_plan(plan: BurstPlan, model_name: str, steps: int, lr: float = 0.05, seed: int = 0, comm=None, *,
             momentum: float = 0.0, warmup: int = 3, dtype: str = "float32", wait_timeout: float = 60.0,
             fail=None, data=None) -> dict:
    """Train ``steps`` SGD steps of ``plan`` on the ranks of ``comm`` (default the world; collective).

    Rank 0 returns ``weights`` (flat, ``model.parameters()`` order), ``iteration_ms`` (the largest
    per-rank median step time after ``warmup`` steps, over the ranks the plan uses), ``rank_ms``,
    ``phases`` (per rank, medians: ``step_ms``, ``compute_ms``, ``transfer_ms`` (redistributions,
    waiting for the peers' compute included), ``sync_ms`` (all-reduce waits)), ``losses`` (mean
    loss per step), ``replica_spread`` (largest weight difference between the ranks of a segment),
    ``segments``; other ranks return their own record. ``data``: the batches as arrays ``(X, y)``
    shaped ``(steps, batch, ...)`` (default :func:`batches`). ``fail=(rank, step, "raise"|"hang")``
    injects a failure."""
    import torch
    from mpi4py import MPI
    torch.set_num_threads(1)
    rank = _Rank(plan, model_name, MPI.COMM_WORLD if comm is None else comm, seed, dtype, wait_timeout)
    data = batches(plan.batch, steps, seed, dtype) if data is None else [*zip(*map(torch.as_tensor, data))]
    times = {"step_ms": [], "compute_ms": [], "transfer_ms": [], "sync_ms": []}
    for step in range(steps):
        if fail is not None and tuple(fail[:2]) == (rank.me, step):
            time.sleep(3600 if fail[2] == "hang" else 0)
            raise RuntimeError(f"injected failure on rank {rank.me} at step {step}")
        rank.clock[:] = [time.perf_counter(), 0.0, 0.0, 0.0]
        loss = rank.forward(step, *data[step])
        _wait(rank.backward(step, loss), wait_timeout, rank.me, f"gradient all-reduce at step {step}")
        rank.lap(3)
        rank.update(lr, momentum)
        for key, v in zip(times, (time.perf_counter() - rank.clock[0], *rank.clock[1:])):
            times[key].append(v * 1e3)
    flats = rank.flats
    record = {"rank": rank.me, "losses": rank.losses, "times": times,
              "weights": {k: flats[k].data.numpy().copy() for k in rank.mine if flats[k].numel}}
    everyone = rank.gather(record)
    return record if everyone is None else _summarise(everyone, rank.segs, steps, warmup)


def _summarise(everyone: list[dict], segs: list[Segment], steps: int, warmup: int) -> dict:
    """Rank 0's result from every rank's record (see :func:`run_plan`)."""
    weights, spread = [], 0.0
    for k, seg in enumerate(segs):
        copies = [everyone[r]["weights"][k] for r in seg.ranks if k in everyone[r]["weights"]]
        if copies:
            weights.append(copies[0])
            spread = max([spread] + [float(np.max(np.abs(c - copies[0]))) for c in copies[1:]])
    last = segs[-1].ranks
    losses = [float(sum(everyone[r]["losses"][s] for r in last)) for s in range(steps)]
    used = sorted({r for s in segs for r in s.ranks})
    warmup = min(warmup, steps - 1)
    phases = {r: {key: statistics.median(v[warmup:]) for key, v in everyone[r]["times"].items()} for r in used}
    rank_ms = {r: phases[r]["step_ms"] for r in used}
    return {"weights": np.concatenate(weights) if weights else np.zeros(0),
            "iteration_ms": max(rank_ms.values()), "rank_ms": rank_ms, "phases": phases, "losses": losses,
            "replica_spread": spread, "steps": steps, "warmup": warmup,
            "ranks": len(everyone), "segments": [[s.first, s.last, list(s.ranks)] for s in segs]}


# -- launcher side (no MPI here) ----------------------------------------------------------------
def _blame(exc, nranks: int) -> ExecuteError:
    """One line naming the failed rank and its exception, then its traceback's tail."""
    text, rank = str(exc), (exc.failed_ranks[0] if exc.failed_ranks else None)
    if "timeout and was killed" in text.splitlines()[0]:
        tail = "\n".join(exc.output.splitlines()[-12:])
        return ExecuteError(f"burst plan on {nranks} ranks: {text.splitlines()[0]}\n{tail}", rank, exc.output)
    sections = dict(re.findall(r"^--- rank (\d+) ---\n(.*?)(?=^--- rank \d+ ---|\Z)", exc.output, re.M | re.S))
    lines = sections.get(str(rank), text).splitlines()
    tb = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    body = lines[tb[-1]:] if tb else lines
    errors = [line for line in body[1:] if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", line)]
    why = errors[-1] if errors else text.splitlines()[0]
    if errors:  # the traceback's tail ends at its exception: MPI's own words after it (an abort racing the
        body = body[:len(body) - body[::-1].index(why)]  # finalize, a broken PMI pipe) do not push it out
    return ExecuteError(f"burst plan on {nranks} ranks failed: {'a rank' if rank is None else f'rank {rank}'}: "
                        f"{why}\n" + "\n".join(body[-12:]), rank, exc.output)


def execute(plan: BurstPlan, model_name: str, steps: int = 20, ranks: int | None = None, timeout: float = 120.0,
            **options) -> dict:
    """Run ``plan`` under ``mpiexec -n ranks`` (default ``plan.gpus``) for ``steps`` steps: rank 0's
    result of :func:`run_plan` (``weights`` a numpy array). ``options``: :data:`OPTIONS`
    (``wait_timeout`` defaults to a quarter of ``timeout``, 5..60 s). The plan is checked first
    (:class:`BurstError`, nothing launched); a failed rank raises :class:`ExecuteError` naming it."""
    from ..runtime.launch.launcher import MPILaunchError, run_mpi
    nranks = integer("ranks", plan.gpus if ranks is None else ranks, error=BurstError)
    integer("steps", steps, error=BurstError)
    unknown = set(options) - set(OPTIONS)
    if unknown or options.get("dtype", "float32") not in DTYPES:
        raise BurstError(f"options are {', '.join(OPTIONS)} (dtype one of {', '.join(DTYPES)}); got {options}")
    segments(plan, model_name, nranks)
    options.setdefault("wait_timeout", max(5.0, min(60.0, timeout / 4)))
    with tempfile.TemporaryDirectory(prefix="workbench-burst-") as tmp:
        plan_path, out = plan.write_json(Path(tmp) / "plan.json"), Path(tmp) / "result.json"
        data = out.with_name("data.npz")
        X, y = zip(*batches(plan.batch, steps, options.get("seed", 0), options.get("dtype", "float32")))
        np.savez(data, X=np.stack(X), y=np.stack(y))  # drawn once here: the ranks need no scikit-learn
        args = ["-m", "workbench.burst.execute", "--plan", str(plan_path), "--model", model_name,
                "--steps", str(steps), "--out", str(out), "--data", str(data)]
        for name, value in options.items():
            if value is not None:
                args += [f"--{name.replace('_', '-')}", ",".join(map(str, value)) if name == "fail" else str(value)]
        try:
            run_mpi(nranks, args, timeout=timeout, cwd=ROOT)
        except MPILaunchError as exc:
            raise _blame(exc, nranks) from None
        result = json.loads(out.read_text())
        result["weights"] = np.load(out.with_suffix(".npy"))
    for key in ("rank_ms", "phases"):
        result[key] = {int(r): v for r, v in result[key].items()}
    return result


def main(argv: list[str] | None = None) -> None:
    """The rank entry (see the module's text)."""
    parser = argparse.ArgumentParser(prog="python -m mpi4py -m workbench.burst.execute")
    for name, kind in (("plan", Path), ("model", str), ("steps", int), ("out", Path), ("data", Path)):
        parser.add_argument(f"--{name}", type=kind, required=name != "data")  # data: X, y arrays (.npz)
    for name, default in OPTIONS.items():  # fail: RANK,STEP,raise|hang
        parser.add_argument(f"--{name.replace('_', '-')}", type=str if default is None else type(default),
                            default=default)
    args = vars(parser.parse_args(argv))
    from mpi4py import MPI
    plan = BurstPlan.from_dict(json.loads(args.pop("plan").read_text()))
    model, steps, out = args.pop("model"), args.pop("steps"), args.pop("out")
    if args["data"]:
        with np.load(args["data"]) as arrays:
            args["data"] = (arrays["X"], arrays["y"])
    fail = args["fail"].split(",") if args["fail"] else None
    args["fail"] = fail and (int(fail[0]), int(fail[1]), fail[2])
    result = run_plan(plan, model, steps, comm=MPI.COMM_WORLD, **args)
    if MPI.COMM_WORLD.Get_rank() == 0:
        np.save(out.with_suffix(".npy"), result.pop("weights"))
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
