"""Every exchange of a rank goes through its one communicator and is counted in one counter: run by
tests/test_communicator.py under ``mpiexec -n 3`` (``python -m mpi4py tests/mpi/one_counter.py DIR``).

1. The communicator's own paths (bucketed sum, fp32 and bf16 mean on a duplicate, the gradient
   reducer, point to point, an explicit count) land in one :class:`Traffic`, each with the bytes its
   formula gives, and sum, average and send what they should.
2. Each family trains for real (``run_rank``: sync-sgd, sync-easgd, diloco with an fp16 outer
   exchange, streaming-diloco overlapping its exchanges on a duplicate, async-easgd's master and
   workers, and a user's D-PSGD from ``examples/``): every communicator a rank made shares its
   Context's counter, that counter holds the messages the family's schedule sends (an uncounted
   path would come short), and ``summary.json``'s traffic is that counter's.

Prints ``one counter: ok <families>`` on rank 0.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("WORKBENCH_TUNING_CACHE", "none")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # the user's algorithm (dpsgd)

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

from workbench.comm.communicator import Communicator  # noqa: E402
from workbench.comm.hooks import Traffic  # noqa: E402
from workbench.comm.implementations import message_wire_bytes  # noqa: E402
from workbench.comm.options import Communication  # noqa: E402
from workbench.config import RunConfig  # noqa: E402
from workbench.optim import fragments  # noqa: E402
from workbench.runtime.rank import worker  # noqa: E402
from workbench.summary import planned_steps  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
OUT = Path(sys.argv[1])


def communicator_paths() -> None:
    """Part 1: each of the communicator's paths, counted in the one counter with its formula's bytes."""
    bounds = [(0, 5), (5, 12)]
    traffic = Traffic()
    net = Communicator(WORLD, "ring", Communication(), 30.0, bounds, traffic)
    ring = lambda n, itemsize=4: message_wire_bytes(n, itemsize, WORLD, "ring")  # noqa: E731
    expected = Traffic()

    def sent(wire: int, dense: int | None = None) -> None:
        expected.messages += 1
        expected.wire_bytes += wire
        expected.dense_wire_bytes += wire if dense is None else dense

    buf = torch.full((12,), RANK + 1.0)
    net.allreduce(buf)
    assert torch.equal(buf, torch.full((12,), SIZE * (SIZE + 1) / 2)), buf
    sent(ring(12))
    x = torch.arange(12.0) * (RANK + 1)
    net.dup().mean(x)  # fp32, on a duplicate: the same counter
    assert torch.allclose(x, torch.arange(12.0) * (SIZE + 1) / 2), x
    sent(ring(12))
    y = torch.full((12,), float(SIZE * (RANK + 1)))
    net.over(WORLD.Dup()).mean(y, [(0, 12)], "bf16")
    assert torch.equal(y, torch.full((12,), SIZE * (SIZE + 1) / 2)), y  # small integers: exact in bf16
    sent(ring(12, 2), ring(12))
    params = [torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(7))]
    grad = torch.full((12,), 1.0)
    reducer = net.gradient_reducer(params, grad)
    assert reducer.traffic is traffic and reducer.reduce() and torch.equal(grad, torch.full((12,), float(SIZE)))
    sent(ring(12))
    right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    mine, theirs = torch.full((12,), float(RANK)), torch.empty(12)
    MPI.Request.Waitall(net.isend(mine, right, 5) + net.irecv(theirs, left, 5))
    assert torch.equal(theirs, torch.full((12,), float(left)))
    sent(48)
    per_tensor = Communicator(WORLD, "ring", Communication(fusion_bytes=0), 30.0, bounds, traffic)
    MPI.Request.Waitall(per_tensor.isend(mine, right, 6) + per_tensor.irecv(theirs, left, 6))  # one per tensor
    sent(20)
    sent(28)
    net.count_message(100, 400)
    sent(100, 400)
    assert traffic == expected, (traffic, expected)


#: the families, each with a configuration small enough for 3 ranks on 2 cores
FAMILIES = {
    "sync-sgd": dict(algorithm="sync-sgd"),
    "sync-easgd": dict(algorithm="sync-easgd", tau=3),
    "diloco": dict(algorithm="diloco", sync_every=8, outer_wire_dtype="fp16"),
    "streaming-diloco": dict(algorithm="streaming-diloco", sync_every=8, fragments=2, sync_delay=1),
    "async-easgd": dict(algorithm="async-easgd", tau=4),
    "dpsgd": dict(algorithm="dpsgd:DPSGD"),
}


def expected_messages(cfg: RunConfig, steps: int, train_samples: int) -> int:
    """What this rank's family sends in a run of ``steps`` steps a worker (fusion: one message per exchange)."""
    name = cfg.spec.name
    if name == "sync-sgd":
        return steps
    if name == "sync-easgd":
        return -(-steps // cfg.tau)
    if name == "d-psgd":
        return 2 * steps
    if name == "diloco":
        return sum(1 for done in range(1, steps + 1) if done % cfg.sync_every == 0 or done == steps)
    if name == "streaming-diloco":
        return sum(cfg.fragments if done == steps else len(fragments.due(done, cfg.fragments, cfg.sync_every, 0))
                   for done in range(1, steps + 1))
    # async-easgd: a worker pushes every tau steps; the master replies to every push
    workers = planned_steps(train_samples, cfg.workers, cfg.batch_size, cfg.epochs)
    pushes = [-(-s // cfg.tau) for s in workers]
    return sum(pushes) if RANK == 0 else pushes[RANK - 1]


def family(name: str, spec: dict) -> None:
    """Part 2: one family's run: one counter per rank, its messages, and the summary's traffic."""
    made: list[Communicator] = []
    contexts = []
    init = Communicator.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    class RecordingContext(worker.Context):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            contexts.append(self)

    Communicator.__init__ = recording_init
    real_context, worker.Context = worker.Context, RecordingContext
    try:
        cfg = RunConfig(ranks=SIZE, epochs=1, telemetry=False, **spec)
        run_dir = OUT / name
        summary = worker.run_rank(cfg, WORLD, run_dir)
    finally:
        Communicator.__init__ = init
        worker.Context = real_context
    (ctx,) = contexts
    counter = ctx.communicator.traffic
    assert ctx.traffic is counter, name
    assert made and all(c.traffic is counter for c in made), f"{name}: {len(made)} communicators, not one counter"
    want = expected_messages(cfg, ctx.steps, ctx.data.train_samples)
    assert counter.messages == want > 0, f"{name} rank {RANK}: counted {counter.messages}, sends {want}"
    everyone = WORLD.gather(counter.as_dict(), root=0)
    if RANK == 0:
        assert summary["bytes_sent"] == sum(t["wire_bytes"] for t in everyone), (name, summary["bytes_sent"])
        assert summary["messages"] == sum(t["messages"] for t in everyone) / SIZE, (name, summary["messages"])
        written = json.loads((run_dir / "summary.json").read_text())
        assert written["bytes_sent"] == summary["bytes_sent"] > 0, name


communicator_paths()
for family_name, family_spec in FAMILIES.items():
    family(family_name, family_spec)
if RANK == 0:
    print("one counter: ok", " ".join(FAMILIES), flush=True)
