"""Run on every rank under mpiexec by tests/test_mpi.py (``python -m mpi4py -m pytest this_file``).

GradientFlow's gradient-communication strategies (:mod:`workbench.comm.strategies`) on small
real models with real backward passes on rank-dependent data: fusion buckets and their message
counts, fused results against a per-tensor blocking all-reduce, overlap (buckets issued from
the backward hooks), CSC's selection (the same on every rank, recomputed independently), the
bytes on the wire against the formulas, CSC's residual conservation in float64, ratio 1 with
momentum correction against momentum SGD, a CSC step worked by hand (DGC's update with the masked
momentum carried), CSC's speed at a constant gradient against momentum SGD's, injected wire
overflows, and the ablations' code paths. Named without the ``test_`` prefix so the outer, single-process pytest does not collect
it. Every rank runs every case in the same order (the cases are collective); every wait has a
timeout, so a bug fails a case instead of hanging the job.
"""
from __future__ import annotations

import hashlib
import math
import os
from functools import partial, partialmethod

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

os.environ.setdefault("WORKBENCH_TUNING_CACHE", "none")  # a direct mpiexec run keeps ~/.cache clean

from workbench.comm import allreduce  # noqa: E402 - lazy name
from workbench.comm.buffers import FlatBuffer  # noqa: E402
from workbench.comm.implementations import buffer_wire_bytes  # noqa: E402
from workbench.comm.mpi_allreduce import choose  # noqa: E402
from workbench.comm.options import Communication  # noqa: E402
from workbench.comm.strategies import BACKOFF, INITIAL_LOSS_SCALE, GradientReducer  # noqa: E402
from workbench.comm.tuning import Tuner  # noqa: E402
from workbench.models import FlatParams, build  # noqa: E402
from workbench.optim import rules  # noqa: E402
from workbench.optim.sync import gradient_step, gradient_step_  # noqa: E402

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
COMMS = {"self": MPI.COMM_SELF, "world": WORLD}
WAIT = 60.0  # seconds: generous for 5 ranks on 2 cores, finite so a bug cannot hang the job
FEATURES, CLASSES, BATCH = 64, 10, 16


@pytest.fixture(autouse=True, scope="module")
def quick_tuning():
    """auto's first use of a (dtype, size) times every candidate (tested in allreduce_cases.py);
    here auto only has to resolve alike on every rank: few repetitions."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Tuner, "measure", partialmethod(Tuner.measure, repetitions=2))
        yield


# -- models, data, rigs ------------------------------------------------------------------------

def make_model(name: str, seed: int = 0) -> nn.Module:
    """The same weights on every rank: ``mlp`` (the zoo's, 4 tensors) or ``deep`` (8 tensors of
    uneven sizes, so fusion thresholds cut them in several ways)."""
    torch.manual_seed(seed)
    if name == "mlp":
        return build("mlp", FEATURES, CLASSES)
    return nn.Sequential(nn.Linear(FEATURES, 24), nn.Tanh(), nn.Linear(24, 20), nn.ReLU(),
                         nn.Linear(20, 12), nn.Tanh(), nn.Linear(12, CLASSES))


def batch(rank: int, step: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Different data on every rank and step."""
    gen = torch.Generator().manual_seed(100_003 * seed + 1009 * rank + step)
    return torch.randn(BATCH, FEATURES, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen)


def loss_of(module: nn.Module, rank: int, step: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    X, y = batch(rank, step, seed)
    return F.cross_entropy(module(X.to(dtype)), y)


class Rig:
    """A model on FlatParams with a GradientReducer, the way SyncSGD wires them."""

    def __init__(self, comm, options: Communication, model: str = "mlp", collective: str = "native",
                 momentum: float = 0.0, seed: int = 0) -> None:
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self.module = make_model(model, seed)
        self.flat = FlatParams(self.module)
        self.reducer = GradientReducer(self.flat.params, self.flat.bounds, self.flat.grad, comm, collective,
                                       options, momentum=momentum, timeout=WAIT)
        self.traffic = self.reducer.traffic  # the one byte counter
        self.csc = self.reducer.csc  # CSC's state (None for the dense hook)
        self.precision = self.reducer.state  # wire precision's state (fp16/bf16)

    def local_gradient(self, step: int) -> torch.Tensor:
        """This rank's gradient at the current weights for ``step``, flat; computed with
        ``autograd.grad``, which leaves ``.grad`` alone and fires no post-accumulate hooks."""
        grads = torch.autograd.grad(loss_of(self.module, self.rank, step), self.flat.params)
        return torch.cat([g.reshape(-1) for g in grads])

    def backward(self, step: int, ratio: float = 1.0) -> int:
        """start, zero_grad, forward and backward; returns how many buckets were issued by the
        time backward returned (the hooks issue them when ``overlap``)."""
        if self.csc is not None:
            self.csc.ratio = ratio
        self.reducer.start()
        self.flat.zero_grad()
        loss_of(self.module, self.rank, step).backward()
        return len(self.reducer._issued)

    def step(self, step: int, ratio: float = 1.0) -> bool:
        self.backward(step, ratio)
        return self.reducer.finish()

    def close(self) -> None:
        self.reducer.close()


def same_on_every_rank(comm, value) -> bool:
    return all(v == value for v in comm.allgather(value))


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def resolved(t: torch.Tensor, comm, collective: str) -> str:
    """The algorithm that runs ``t``'s all-reduce (``auto`` resolved: collective on first use)."""
    if comm.Get_size() == 1 or collective != "auto":
        return collective
    return choose(FlatBuffer(t), comm)


def summed(comm, t: torch.Tensor, collective: str = "native") -> torch.Tensor:
    """A blocking all-reduce of a copy."""
    return allreduce(t.clone(), comm, collective)


def dense_message_bytes(elements: int, itemsize: int, comm, collective: str) -> int:
    """Bytes one rank sends for one all-reduce message: native's 2(n-1)/n share written out,
    a schedule's exact count from its compiled plan (the implementation's formula)."""
    n = comm.Get_size()
    if n == 1 or elements == 0:
        return 0
    if collective == "native":
        return round(2 * (n - 1) / n * elements * itemsize)
    dtype = {4: np.float32, 2: np.float16}[itemsize]
    return buffer_wire_bytes(FlatBuffer(np.empty(elements, dtype=dtype)), comm, collective)


def expected_selection(rig: Rig, v_before: torch.Tensor, ratio: float) -> list[torch.Tensor]:
    """CSC's choice recomputed outside the library: per bucket, the chunks' L1 norms of the
    accumulator, summed over ranks (a blocking all-reduce with the same collective), the top
    ceil(ratio*K) with ties to the lower index, in index order."""
    c = rig.reducer.options.sparse_chunk
    out = []
    for bucket in rig.reducer.buckets:
        part = v_before[bucket.start:bucket.stop]
        chunks = -(-part.numel() // c)
        norms = torch.stack([part[i * c:(i + 1) * c].abs().sum() for i in range(chunks)])
        norms = summed(rig.comm, norms, rig.reducer.wire.collective)
        keep = chunks if ratio >= 1 else min(chunks, math.ceil(ratio * chunks))
        ranked = sorted(range(chunks), key=lambda i: (-float(norms[i]), i))
        out.append(torch.tensor(sorted(ranked[:keep]), dtype=torch.int64))
    return out


def chunk_mask(n: int, c: int, selected: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    for i in selected.tolist():
        mask[i * c:(i + 1) * c] = True
    return mask


# -- 1. fusion: buckets and messages ------------------------------------------------------------

@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("model", ["mlp", "deep"])
@pytest.mark.parametrize("theta", [0, 512, 2000, None])
def test_fusion_threshold_sets_the_buckets_and_the_message_count(comm_name, model, theta):
    rig = Rig(COMMS[comm_name], Communication(fusion_bytes=theta), model)
    nparams = len(rig.flat.params)
    buckets = rig.reducer.buckets
    sizes = [b.numel * 4 for b in buckets]
    if theta == 0:
        assert len(buckets) == nparams and [b.params for b in buckets] == [(i,) for i in reversed(range(nparams))]
    elif theta is None:
        assert len(buckets) == 1 and buckets[0].params == tuple(reversed(range(nparams)))
    else:
        assert 1 < len(buckets) < nparams  # these thresholds cut both models into several buckets
        assert all(s >= theta for s in sizes[:-1]), sizes
        for b in buckets[:-1]:  # minimal: the bucket without its last parameter was below theta
            a, z = rig.flat.bounds[b.params[-1]]
            assert (b.numel - (z - a)) * 4 < theta
    # the buckets tile the pool in backward order, each a view of it
    assert sum(sizes) == rig.flat.numel * 4
    assert [p for b in buckets for p in b.params] == list(reversed(range(nparams)))
    assert [b.stop for b in buckets[1:]] == [b.start for b in buckets[:-1]] and buckets[0].stop == rig.flat.numel
    assert all(b.buffer.data_ptr() == rig.flat.grad[b.start:].data_ptr() for b in buckets)
    for step in range(2):
        assert rig.step(step)
        assert rig.traffic.messages == (step + 1) * len(buckets)
    rig.close()


# -- 2. fused results equal a per-tensor blocking all-reduce ------------------------------------

@pytest.mark.parametrize("collective", ["native", "ring", "auto"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("theta", [0, 1000, None])
def test_fused_gradients_equal_a_per_tensor_blocking_allreduce(theta, overlap, collective):
    """What holds, and why:

    - always close (rtol 1e-5): the same sum, in another order at most;
    - bit for bit on one or two ranks: each element is one addition, and float addition commutes;
    - bit for bit for a schedule (ring, or what auto resolves to when that is a schedule) at
      theta = 0: the same schedule on the same length adds in the same order, blocking or not;
    - bit for bit, for a schedule, against a blocking all-reduce of each whole bucket: fusion
      changes the chunk boundaries, hence the order of the additions, not the arithmetic;
    - (native at 3+ ranks is MPICH's business: only close);
    - the same bits on every rank (every rank must apply the same step).
    """
    rig = Rig(WORLD, Communication(fusion_bytes=theta, overlap=overlap), "deep", collective)
    for step in range(2):
        local = rig.local_gradient(step)
        issued = rig.backward(step)
        if not overlap:
            assert torch.equal(rig.flat.grad, local)  # nothing issued yet: the local gradient
        assert rig.reducer.finish()
        per_tensor = torch.cat([summed(WORLD, local[a:b], collective) for a, b in rig.flat.bounds])
        torch.testing.assert_close(rig.flat.grad, per_tensor, rtol=1e-5, atol=1e-6)
        if SIZE <= 2:
            assert torch.equal(rig.flat.grad, per_tensor)
        for bucket in rig.reducer.buckets:
            part = slice(bucket.start, bucket.stop)
            if resolved(local[part], WORLD, collective) != "native":  # a schedule ran this bucket
                assert torch.equal(rig.flat.grad[part], summed(WORLD, local[part], collective))
                if theta == 0:
                    assert torch.equal(rig.flat.grad[part], per_tensor[part])
        assert same_on_every_rank(WORLD, digest(rig.flat.grad))
        assert issued == (len(rig.reducer.buckets) if overlap else 0)
    rig.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_on_one_rank_the_reducer_leaves_the_local_gradient(overlap):
    rig = Rig(MPI.COMM_SELF, Communication(fusion_bytes=700, overlap=overlap), "deep", "ring")
    local = rig.local_gradient(0)
    assert rig.step(0)
    assert torch.equal(rig.flat.grad, local)
    assert rig.traffic.wire_bytes == rig.traffic.dense_wire_bytes == 0
    rig.close()


# -- 3. overlap: buckets issued from inside backward --------------------------------------------

@pytest.mark.parametrize("collective", ["native", "ring"])
@pytest.mark.parametrize("theta", [0, 1000])
def test_overlap_issues_buckets_while_backward_runs(theta, collective):
    """Observed from outside the library: a post-accumulate-grad hook of our own, registered
    before the reducer's on every parameter (so it runs first), records how many buckets were
    issued when each gradient arrived. Before the last gradient of backward arrives, the
    buckets of the layers backward went through first are already in flight."""
    module = make_model("deep")
    flat = FlatParams(module)
    seen: list[int] = []
    holder: dict = {}
    mine = [p.register_post_accumulate_grad_hook(lambda _p: seen.append(len(holder["r"]._issued)))
            for p in flat.params]
    reducer = holder["r"] = GradientReducer(flat.params, flat.bounds, flat.grad, WORLD, collective,
                                            Communication(fusion_bytes=theta, overlap=True), timeout=WAIT)
    assert len(reducer.buckets) >= 3
    for step in range(2):
        seen.clear()
        reducer.start()
        flat.zero_grad()
        loss_of(module, RANK, step).backward()
        assert len(seen) == len(flat.params)
        assert seen[0] == 0 and seen[-1] >= 1  # the last gradient finds earlier buckets issued
        assert seen == sorted(seen)
        assert len(reducer._issued) == len(reducer.buckets)  # all issued before finish()
        assert reducer.finish()
    for handle in mine:
        handle.remove()
    reducer.close()


def test_without_overlap_nothing_is_issued_before_finish():
    rig = Rig(WORLD, Communication(fusion_bytes=0, overlap=False), "deep")
    assert rig.backward(0) == 0 and rig.traffic.messages == 0
    assert rig.reducer.finish() and rig.traffic.messages == len(rig.reducer.buckets)
    rig.close()


# -- 4. CSC: the same selection on every rank, and the one the formula gives ---------------------

@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("collective", ["native", "ring"])
@pytest.mark.parametrize("theta,chunk,overlap", [(None, 64, False), (2000, 37, True), (0, 100, False)])
def test_csc_selects_the_same_chunks_on_every_rank(comm_name, collective, theta, chunk, overlap):
    comm = COMMS[comm_name]
    ratio, momentum = 0.25, 0.9
    rig = Rig(comm, Communication(fusion_bytes=theta, overlap=overlap, sparse_ratio=ratio, sparse_chunk=chunk),
              "mlp", collective, momentum=momentum)
    expected_digest = hashlib.sha256()
    fewer = False
    for step in range(4):
        u0, v0 = rig.csc.u.clone(), rig.csc.v.clone()
        g = rig.local_gradient(step)
        u1 = momentum * u0 + g  # momentum correction
        v1 = v0 + u1            # residual
        selection = expected_selection(rig, v1, ratio)
        assert rig.step(step, ratio)
        sent = torch.zeros_like(v1, dtype=torch.bool)
        dense_first = []  # the digest's order: a bucket sent whole records at issue, the others
        sparse_then = []  # once their norms are back (finish() waits the buckets in index order)
        for bucket, chosen in zip(rig.reducer.buckets, selection):
            chunks = -(-bucket.numel // chunk)
            assert chosen.numel() == min(chunks, math.ceil(ratio * chunks))
            fewer |= chosen.numel() < chunks
            record = bucket.index.to_bytes(4, "little") + chosen.numpy().astype(np.int64).tobytes()
            (dense_first if chosen.numel() == chunks else sparse_then).append(record)
            sent[bucket.start:bucket.stop] = chunk_mask(bucket.numel, chunk, chosen)
        for record in dense_first + sparse_then:
            expected_digest.update(record)
        assert rig.csc.selection_digest == expected_digest.hexdigest()
        # what was sent is the sum over ranks of the accumulator on the chosen chunks, the rest 0
        torch.testing.assert_close(rig.flat.grad, summed(comm, torch.where(sent, v1, 0.0)), rtol=1e-5, atol=1e-6)
        assert (rig.flat.grad[~sent] == 0).all()
        # the residual keeps the rest; momentum factor masking clears the sent chunks in u
        assert torch.equal(rig.csc.v, torch.where(sent, 0.0, v1))
        assert torch.equal(rig.csc.u, torch.where(sent, 0.0, u1))
        with torch.no_grad():  # a step, so the gradients move
            rig.flat.data.sub_(0.1 * rig.flat.grad / comm.Get_size())
    assert fewer  # non-trivial: ratio < 1 sent fewer than all chunks
    digests = comm.allgather(rig.csc.selection_digest)
    assert len(set(digests)) == 1 and digests[0]
    assert same_on_every_rank(comm, digest(rig.flat.data))
    rig.close()


# -- 5. bytes on the wire ----------------------------------------------------------------------

@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("collective", ["native", "ring"])
@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("theta", [0, None])
def test_dense_wire_bytes_follow_the_formula(comm_name, collective, wire, theta):
    """fp32: the formula; fp16: half the payload (native's 2(n-1)/n share is rounded per
    message: within a byte each) plus the overflow decision (one float32, native); bf16 travels
    as bf16 too, but MPI has no bf16 sum, so ``native`` runs the ring schedule; the dense
    equivalent is what the run's own collective would send in fp32."""
    comm = COMMS[comm_name]
    rig = Rig(comm, Communication(fusion_bytes=theta, wire_dtype=wire), "mlp", collective)
    steps = 2
    for step in range(steps):
        assert rig.step(step)
    lengths = [b.numel for b in rig.reducer.buckets]
    ran = "ring" if wire != "fp32" else collective  # half-precision wires run ring where native was asked
    fp32 = sum(dense_message_bytes(n, 4, comm, collective) for n in lengths)
    half = sum(dense_message_bytes(n, 2, comm, ran) for n in lengths)
    decision = dense_message_bytes(1, 4, comm, "native")
    assert rig.traffic.dense_wire_bytes == steps * fp32
    if wire == "fp32":
        assert rig.traffic.wire_bytes == steps * fp32
        assert rig.traffic.messages == steps * len(lengths)
    else:
        assert rig.traffic.wire_bytes == steps * (half + decision)
        assert rig.traffic.messages == steps * (len(lengths) + 1)
        same = sum(dense_message_bytes(n, 4, comm, ran) for n in lengths)  # fp32 over what ran
        exact = ran == "ring" or comm.Get_size() in (1, 2, 4)  # 2(n-1)/n * 2 bytes is whole
        assert abs(2 * half - same) <= (0 if exact else len(lengths))
    if comm.Get_size() == 1:
        assert rig.traffic.wire_bytes == 0
    rig.close()


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("collective", ["native", "ring"])
@pytest.mark.parametrize("wire", ["fp32", "fp16"])
@pytest.mark.parametrize("theta,chunk,ratio", [(None, 37, 0.1), (0, 64, 0.3), (None, 100, 1.0)])
def test_csc_wire_bytes_are_the_norms_plus_the_packed_chunks(comm_name, collective, wire, theta, chunk, ratio):
    comm = COMMS[comm_name]
    momentum = 0.5
    rig = Rig(comm, Communication(fusion_bytes=theta, wire_dtype=wire, sparse_ratio=0.1, sparse_chunk=chunk),
              "mlp", collective, momentum=momentum)
    itemsize = 4 if wire == "fp32" else 2
    wire_bytes = dense = messages = 0
    for step in range(3):
        v1 = rig.csc.v + (momentum * rig.csc.u + rig.local_gradient(step))
        selection = expected_selection(rig, v1, ratio)
        assert rig.step(step, ratio)
        for bucket, chosen in zip(rig.reducer.buckets, selection):
            n = bucket.numel
            chunks = -(-n // chunk)
            packed = int(chunk_mask(n, chunk, chosen).sum())  # the last chunk may be short
            if chosen.numel() < chunks:  # norms first: K float32 (dense warm-up sends none)
                wire_bytes += dense_message_bytes(chunks, 4, comm, collective)
                messages += 1
            data_collective = collective if wire == "fp32" else "ring"  # half precision: ring, see strategies
            wire_bytes += dense_message_bytes(packed, itemsize, comm, data_collective)
            messages += 1
            dense += dense_message_bytes(n, 4, comm, collective)
        if wire != "fp32":
            wire_bytes += dense_message_bytes(1, 4, comm, "native")
            messages += 1
        assert (rig.traffic.wire_bytes, rig.traffic.dense_wire_bytes, rig.traffic.messages) == (wire_bytes, dense, messages)
    if ratio < 1 and comm.Get_size() > 1:  # buckets of one chunk still go whole
        assert rig.traffic.wire_bytes < 2 * ratio * rig.traffic.dense_wire_bytes
    rig.close()


# -- 6. CSC's residual conserves the gradient (float64) ------------------------------------------

def _float64_pool(module: nn.Module):
    params = [p for p in module.parameters()]
    bounds, offset = [], 0
    for p in params:
        bounds.append((offset, offset + p.numel()))
        offset += p.numel()
    return params, bounds, torch.zeros(offset, dtype=torch.float64)


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("collective", ["native", "ring"])
@pytest.mark.parametrize("theta,chunk", [(None, 50), (2000, 33)])
def test_csc_residual_conserves_every_gradient_in_float64(comm_name, collective, theta, chunk):
    """Sent over all steps plus the residuals left on all ranks is every gradient of every rank
    and step: nothing is lost, nothing is counted twice (residual on, momentum correction off)."""
    comm = COMMS[comm_name]
    module = make_model("mlp").double()  # FlatParams is float32: a float64 pool of our own
    params, bounds, pool = _float64_pool(module)
    reducer = GradientReducer(params, bounds, pool, comm, collective,
                              Communication(fusion_bytes=theta, sparse_ratio=0.2, sparse_chunk=chunk,
                                            momentum_correction=False, residual=True), timeout=WAIT)
    csc = reducer.csc
    assert csc.v.dtype == torch.float64
    total_local = torch.zeros_like(pool)
    total_sent = torch.zeros_like(pool)
    for step in range(5):
        grads = torch.autograd.grad(loss_of(module, comm.Get_rank(), step, dtype=torch.float64), params)
        g = torch.cat([x.reshape(-1) for x in grads])
        total_local += g
        pool.copy_(g)
        csc.ratio = 0.2
        assert reducer.reduce()
        total_sent += pool
        with torch.no_grad():
            for p, (a, b) in zip(params, bounds):
                p.sub_(0.05 * pool[a:b].view_as(p) / comm.Get_size())
    every_gradient = summed(comm, total_local)
    left = summed(comm, csc.v)
    assert (csc.v != 0).sum() > 0 and (total_sent != 0).sum() > 0  # both parts matter
    torch.testing.assert_close(total_sent + left, every_gradient, rtol=1e-12, atol=1e-12)
    assert (csc.u == 0).all()  # no momentum correction: u unused
    reducer.close()


# -- 7. ratio 1 with momentum correction is momentum SGD -------------------------------------------

@pytest.mark.parametrize("collective", ["native", "ring"])
@pytest.mark.parametrize("theta,overlap", [(None, False), (1000, True)])
@pytest.mark.parametrize("carry", [True, False])
def test_ratio_one_with_momentum_correction_is_momentum_sgd(collective, theta, overlap, carry):
    """A dense warm-up step: with the carry, every send clears u and the momentum lives in the
    optimizer's velocity (psi(1) = 1); without it, u is left unmasked and holds the momentum."""
    lr, momentum = 0.1, 0.9
    csc = Rig(WORLD, Communication(fusion_bytes=theta, overlap=overlap, sparse_ratio=0.05, sparse_chunk=32,
                                   carry_momentum=carry), "deep", collective, momentum=momentum)
    assert csc.reducer.momentum_in_communication
    dense = Rig(WORLD, Communication(), "deep", collective)
    velocity, csc_velocity = torch.zeros_like(dense.flat.data), torch.zeros_like(dense.flat.data)
    assert torch.equal(csc.flat.data, dense.flat.data)
    for step in range(5):
        csc.backward(step, 1.0)
        assert csc.csc.mask_momentum is carry  # a dense warm-up step masks only to carry
        assert csc.reducer.finish()
        x, csc_velocity = gradient_step(csc.flat.data, csc_velocity, csc.reducer, SIZE, lr, momentum)
        csc.flat.data.copy_(x)
        assert dense.step(step)
        x, velocity = rules.momentum_sgd(dense.flat.data, velocity, dense.flat.grad / SIZE, lr, momentum)
        dense.flat.data.copy_(x)
        torch.testing.assert_close(csc.flat.data, dense.flat.data, rtol=1e-6, atol=1e-6)
    assert (csc.csc.v == 0).all()  # everything was sent
    if carry:
        assert (csc.csc.u == 0).all() and (csc.csc.carry_weight == 1).all()
        torch.testing.assert_close(csc_velocity, velocity, rtol=1e-6, atol=1e-7)  # the momentum, carried
    else:
        assert (csc.csc.u != 0).any() and (csc_velocity == 0).all()  # the momentum kept in u
    assert (csc.flat.data != make_model_flat("deep")).any()  # it moved
    csc.close(), dense.close()


def make_model_flat(name: str) -> torch.Tensor:
    return FlatParams(make_model(name)).data


# -- 8. an overflow on the wire skips the step on every rank -------------------------------------

OVERFLOWS = [("fp16", "dense", math.inf), ("fp16", "dense", 1e3), ("bf16", "dense", math.inf),
             ("fp16", "csc", math.inf), ("fp16", "csc", 1e3), ("bf16", "csc", math.inf),
             ("fp16", "warm-up", math.inf), ("bf16", "warm-up", math.inf)]


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("wire,mode,value", OVERFLOWS)
def test_an_injected_overflow_skips_that_step_on_every_rank(comm_name, wire, mode, value):
    """One rank's gradient gets ``inf`` (or 1e3: 1e3 x scale 4096 / p is past fp16's 65504)
    at step 2: every rank's finish() says False at that step, a SyncSGD-like loop that skips
    keeps every weight finite, fp16's loss scale halves, and the next steps apply. ``warm-up``
    is CSC at ratio 1 (momentum correction without masking: an ``inf`` left in u would make
    every later step overflow, so a skipped step must put u and v back)."""
    comm = COMMS[comm_name]
    bad_rank, bad_step, steps, lr, momentum = comm.Get_size() - 1, 2, 5, 0.05, 0.9
    sparse = {} if mode == "dense" else {"sparse_ratio": 0.25, "sparse_chunk": 64}
    ratio = 1.0 if mode != "csc" else 0.25
    rig = Rig(comm, Communication(fusion_bytes=1000, wire_dtype=wire, **sparse), "mlp", "ring", momentum=momentum)
    velocity = torch.zeros_like(rig.flat.data)
    applied = []
    for step in range(steps):
        before = (rig.csc.u.clone(), rig.csc.v.clone()) if sparse else None
        rig.backward(step, ratio)
        if step == bad_step and rig.rank == bad_rank:
            rig.flat.grad[5] = value  # overlap is off: nothing has been issued yet
        ok = rig.reducer.finish()
        applied.append(ok)
        if sparse and not ok:  # a skipped step leaves CSC's momentum and residual as they were
            assert torch.equal(rig.csc.u, before[0]) and torch.equal(rig.csc.v, before[1])
        if sparse and not ok:
            assert (rig.csc.carry_weight == 0).all()  # nothing carried from a skipped step
        if ok:
            x, velocity = gradient_step(rig.flat.data, velocity, rig.reducer, rig.size, lr, momentum)
            rig.flat.data.copy_(x)
        assert torch.isfinite(rig.flat.data).all()
        assert not rig.reducer.momentum_in_communication or (
            torch.isfinite(rig.csc.u).all() and torch.isfinite(rig.csc.v).all()), f"step {step}"
        scale = INITIAL_LOSS_SCALE * (BACKOFF if wire == "fp16" and step >= bad_step else 1.0)
        assert rig.precision.loss_scale == scale
    assert applied == [step != bad_step for step in range(steps)]
    assert rig.traffic.skipped_steps == 1 and same_on_every_rank(comm, rig.traffic.skipped_steps)
    assert same_on_every_rank(comm, (applied, digest(rig.flat.data)))
    rig.close()


# -- 9. the ablations run -------------------------------------------------------------------------

@pytest.mark.parametrize("residual,correction", [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("wire", ["fp32", "fp16"])
def test_csc_without_residual_or_momentum_correction_runs(residual, correction, wire):
    momentum = 0.9
    rig = Rig(WORLD, Communication(fusion_bytes=1000, wire_dtype=wire, sparse_ratio=0.2, sparse_chunk=40,
                                   residual=residual, momentum_correction=correction), "mlp", "native",
              momentum=momentum)
    velocity = torch.zeros_like(rig.flat.data)
    for step in range(4):
        assert rig.step(step, 0.2)
        assert torch.isfinite(rig.flat.grad).all() and (rig.flat.grad != 0).any()
        if not residual:
            assert (rig.csc.v == 0).all()  # nothing kept
        if not correction:
            assert (rig.csc.u == 0).all()  # momentum stays with the optimizer
        x, velocity = gradient_step(rig.flat.data, velocity, rig.reducer, SIZE, 0.05, momentum)
        rig.flat.data.copy_(x)
        assert torch.isfinite(rig.flat.data).all()
    assert rig.reducer.momentum_in_communication == correction
    assert same_on_every_rank(WORLD, (rig.csc.selection_digest, digest(rig.flat.data)))
    rig.close()


# -- 10. CSC's update worked by hand: DGC's step, with the masked momentum carried on --------------

def _pool_rig(comm, n: int, options: Communication, momentum: float) -> GradientReducer:
    """A reducer over one float64 parameter of ``n`` elements (no model: the test sets the gradient)."""
    param = nn.Parameter(torch.zeros(n, dtype=torch.float64))
    return GradientReducer([param], [(0, n)], torch.zeros(n, dtype=torch.float64), comm, "native", options,
                           momentum=momentum, timeout=WAIT)


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("carry", [True, False])
def test_a_csc_step_by_hand_is_dgc_with_the_masked_momentum_carried(comm_name, carry):
    """Two steps on 4 chunks of 2, ratio 0.5, m = 0.5, lr = 0.1, every rank the same gradient
    (the mean is that gradient). DGC: u <- m u + g; v <- v + u; send the chunks of largest L1
    norm; clear them in u and v; the optimizer steps by the sent mean. With the carry, its
    velocity keeps psi(T) of the sent mean, T = 4 chunks / 2 sent = 2 steps:
    psi(2) = (1 - m^2)(1 - m)/(2(1 - m) - m(1 - m^2)) = 0.375/0.625 = 0.6."""
    comm, lr, m = COMMS[comm_name], 0.1, 0.5
    reducer = _pool_rig(comm, 8, Communication(sparse_ratio=0.5, sparse_chunk=2, carry_momentum=carry), m)
    csc, size = reducer.csc, comm.Get_size()
    x, velocity = torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
    t = partial(torch.tensor, dtype=torch.float64)
    share = 0.6 if carry else 0.0
    # step 0: u = v = g; norms 8, 2, 6, 1: chunks 0 and 2 go
    csc.ratio = 0.5
    reducer.grad.copy_(t([4, 4, 1, 1, 3, -3, 0.5, 0.5]))
    assert reducer.reduce()
    sent = t([4, 4, 0, 0, 3, -3, 0, 0])
    torch.testing.assert_close(reducer.grad / size, sent, rtol=0, atol=0)
    assert torch.equal(csc.u, t([0, 0, 1, 1, 0, 0, 0.5, 0.5])) and torch.equal(csc.v, csc.u)
    x, velocity = gradient_step(x, velocity, reducer, size, lr, m)
    torch.testing.assert_close(x, -lr * sent, rtol=0, atol=1e-15)
    torch.testing.assert_close(velocity, -lr * share * sent, rtol=1e-12, atol=1e-15)
    # step 1: g = 1: u = (1, 1, 1.5, 1.5, 1, 1, 1.25, 1.25), v = (1, 1, 2.5, 2.5, 1, 1, 1.75, 1.75);
    # norms 2, 5, 2, 3.5: chunks 1 and 3 go
    reducer.grad.fill_(1.0)
    assert reducer.reduce()
    sent2 = t([0, 0, 2.5, 2.5, 0, 0, 1.75, 1.75])
    torch.testing.assert_close(reducer.grad / size, sent2, rtol=0, atol=0)
    assert torch.equal(csc.u, t([1, 1, 0, 0, 1, 1, 0, 0])) and torch.equal(csc.v, csc.u)
    torch.testing.assert_close(csc.carry_weight, share * (sent2 != 0).double(), rtol=1e-12, atol=0)
    x2, velocity2 = gradient_step(x, velocity, reducer, size, lr, m)
    torch.testing.assert_close(x2, x - lr * sent2 + m * velocity, rtol=0, atol=1e-15)  # DGC's step + the carry
    torch.testing.assert_close(velocity2, m * velocity - lr * share * sent2, rtol=1e-12, atol=1e-15)
    reducer.close()


@pytest.mark.parametrize("options", [Communication(), Communication(sparse_ratio=0.5, sparse_chunk=2)])
def test_the_in_place_step_is_the_functional_one_bit_for_bit(options):
    """sync-sgd's update in place (gradient_step_: no model-sized temporaries) gives the bits of
    gradient_step, dense and with CSC's carried momentum, over steps with the velocity built up."""
    m, n = 0.9, 64
    reducer = _pool_rig(WORLD, n, options, m)
    gen = torch.Generator().manual_seed(RANK)
    x, velocity = torch.randn(n, dtype=torch.float64, generator=gen), torch.zeros(n, dtype=torch.float64)
    x_, velocity_, scratch = x.clone(), velocity.clone(), torch.empty_like(x)
    for step in range(5):
        if reducer.csc is not None:
            reducer.csc.ratio = 0.5
        reducer.grad.copy_(torch.randn(n, dtype=torch.float64, generator=gen))
        assert reducer.reduce()
        x, velocity = gradient_step(x, velocity, reducer, SIZE, 0.05, m)
        gradient_step_(x_, velocity_, reducer, SIZE, 0.05, m, scratch)
        assert torch.equal(x_, x) and torch.equal(velocity_, velocity), step
    assert velocity.abs().sum() > 0
    reducer.close()


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_csc_clips_each_ranks_gradient_to_its_share_of_clip_norm_on_sparse_steps(comm_name, ratio):
    """DGC's local gradient clipping: two tensors of 6 and 2 elements, one bucket each, every rank
    the same gradient (so the sent sum is ``size`` times what each rank folded in). On a sparse
    step the folded gradient (what stayed in v plus the sent mean) is the gradient scaled to
    ``clip_norm / sqrt(size)`` in all, each bucket to its share sqrt(n_b / n) of it; a bucket
    already under its share, and every bucket on a dense step, is folded in as it was."""
    comm, clip = COMMS[comm_name], 0.8
    size = comm.Get_size()
    params = [nn.Parameter(torch.zeros(6, dtype=torch.float64)), nn.Parameter(torch.zeros(2, dtype=torch.float64))]
    reducer = GradientReducer(params, [(0, 6), (6, 8)], torch.zeros(8, dtype=torch.float64), comm, "native",
                              Communication(fusion_bytes=0, sparse_ratio=0.5, sparse_chunk=2, clip_norm=clip),
                              momentum=0.9, timeout=WAIT)
    assert len(reducer.buckets) == 2
    g = torch.tensor([3.0, -4.0, 12.0, 0.0, 1.0, 2.0, 0.01, -0.02], dtype=torch.float64)
    reducer.csc.ratio = ratio
    reducer.grad.copy_(g)
    assert reducer.reduce()
    folded = reducer.csc.v + reducer.grad / size
    big, small = slice(0, 6), slice(6, 8)
    if ratio < 1.0:
        share = clip * math.sqrt(6 / 8) / math.sqrt(size)
        assert float(g[big].norm()) > share
        torch.testing.assert_close(folded[big], g[big] * share / g[big].norm(), rtol=1e-12, atol=0)
        assert float(folded[big].norm()) == pytest.approx(share, rel=1e-12)
    else:
        torch.testing.assert_close(folded[big], g[big], rtol=1e-12, atol=0)
    torch.testing.assert_close(folded[small], g[small], rtol=1e-12, atol=0)  # under its share: as it was
    reducer.close()


@pytest.mark.parametrize("carry,speed", [(True, 1.0), (False, 1 - 0.9 * (1 - 0.9 ** 2) / (2 * 0.1))])
def test_csc_moves_at_momentum_sgds_speed_at_a_constant_gradient(carry, speed):
    """Two chunks of the same constant gradient g, ratio 0.5: each is sent every other step.
    Momentum SGD's weights move lr g/(1 - m) per step once the velocity has built up; CSC with
    the carry moves as fast, every two steps (exact once m^t has died out: 300 steps); DGC's
    masking as published moves 1 - m(1 - m^T)/(T(1 - m)) = 0.145 as fast (T = 2, m = 0.9)."""
    lr, m, g = 0.1, 0.9, 1.0
    reducer = _pool_rig(WORLD, 4, Communication(sparse_ratio=0.5, sparse_chunk=2, carry_momentum=carry), m)
    x, velocity = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    positions = []
    for _ in range(300):
        reducer.csc.ratio = 0.5
        reducer.grad.fill_(g)
        assert reducer.reduce()
        x, velocity = gradient_step(x, velocity, reducer, SIZE, lr, m)
        positions.append(x.clone())
    assert (reducer.csc.u == 0).tolist() in ([True, True, False, False], [False, False, True, True])  # alternating
    per_step = (positions[-3] - positions[-1]) / 2
    torch.testing.assert_close(per_step, torch.full_like(x, speed * lr * g / (1 - m)), rtol=1e-9, atol=0)
    reducer.close()
