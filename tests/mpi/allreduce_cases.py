"""Run on every rank under mpiexec by tests/test_mpi.py (``python -m mpi4py -m pytest this_file``).

Named without the ``test_`` prefix so the outer, single-process pytest does not collect it.
Each body runs on COMM_SELF and on COMM_WORLD (mpi4py's test style).
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

from workbench.collectives import (SUPPORTED_DTYPES, UnsupportedDtypeError, algorithm_names,
                                   allreduce, schedules)
from workbench.comm.executor import private_comm
from workbench.comm.tuning import _TUNER, Tuner, bucket_of, tuner_for
from workbench.telemetry import Telemetry, recording

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
COMMS = {"self": MPI.COMM_SELF, "world": WORLD}
LENGTHS = [0, 1, 2, 3, 5, 7, 13, 64, 1001, 4099]
CASES = [(kind, dtype) for kind in ("numpy", "torch") for dtype in SUPPORTED_DTYPES
         if not (kind == "numpy" and dtype == "bfloat16")]  # numpy has no bfloat16


def integer_valued(length: int, rank: int, seed: int = 0) -> np.ndarray:
    """Small integers: every partial sum is exact in every dtype, so results compare exactly."""
    return ((np.arange(length) * 7 + rank * 3 + seed) % 11 - 5).astype(np.float64)


def make(kind: str, dtype: str, values: np.ndarray):
    if kind == "numpy":
        return values.astype(dtype)
    return torch.tensor(values).to(getattr(torch, dtype))  # a copy: never alias `values`


def as_float64(buf) -> np.ndarray:
    return buf.astype(np.float64) if isinstance(buf, np.ndarray) else buf.double().numpy()


def reference(comm, values: np.ndarray) -> np.ndarray:
    ref = values.copy()
    comm.Allreduce(MPI.IN_PLACE, ref)
    return ref


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("algorithm", algorithm_names())
@pytest.mark.parametrize("kind,dtype", CASES)
def test_allreduce_matches_mpi_allreduce(comm_name, algorithm, kind, dtype):
    comm = COMMS[comm_name]
    for length in LENGTHS:
        values = integer_valued(length, comm.Get_rank())
        buf = make(kind, dtype, values)
        out = allreduce(buf, comm, algorithm)
        assert out is buf
        np.testing.assert_array_equal(as_float64(buf), reference(comm, values),
                                      err_msg=f"length {length}")


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("algorithm", list(schedules.SCHEDULES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_schedules_on_random_floats_agree_bitwise_across_ranks(comm_name, algorithm, dtype):
    comm = COMMS[comm_name]
    rng = np.random.default_rng(comm.Get_rank())
    values = rng.standard_normal(10007)
    buf = values.astype(dtype)
    allreduce(buf, comm, algorithm)
    np.testing.assert_allclose(buf, reference(comm, values), rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-5)
    digests = comm.allgather(hashlib.sha1(buf.tobytes()).hexdigest())
    assert len(set(digests)) == 1, "ranks ended with different bits"


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_bfloat16_is_summed_in_float32_and_rounded_once_by_every_algorithm(algorithm):
    # 256 + 1 + 1 + ... in bfloat16 (8 significant bits) stays 256 step by step; summed in float32
    # and rounded once it is the nearest bfloat16 of the true sum. Native reduces in float32, so
    # every schedule (and auto, whichever it picks for a size) must give that same value.
    comm = WORLD
    for length in (1, 7, 4099):
        values = np.where(np.arange(length) % 2 == 0, 256.0 if comm.Get_rank() == 0 else 1.0,
                          0.5 + comm.Get_rank() / 128)
        mine = torch.tensor(values, dtype=torch.bfloat16)
        exact = reference(comm, mine.double().numpy())  # small sums of bfloat16 values: exact in float64
        expected = torch.tensor(exact, dtype=torch.float32).to(torch.bfloat16)
        out = allreduce(mine, comm, algorithm)
        assert torch.equal(out, expected), (algorithm, comm.Get_size(), length, out[:4], expected[:4])


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling", "native"])
def test_non_contiguous_and_multidimensional_buffers_reduce_in_place(algorithm):
    rank = WORLD.Get_rank()
    base = np.full((6, 8), 100.0)
    view = base[::2, 1::3]  # non-contiguous view
    view[...] = rank + 1
    allreduce(view, WORLD, algorithm)
    total = sum(r + 1 for r in range(WORLD.Get_size()))
    assert (view == total).all()
    untouched = np.ones_like(base, dtype=bool)
    untouched[::2, 1::3] = False
    assert (base[untouched] == 100.0).all(), "elements outside the view were written"

    t = torch.full((4, 5), float(rank + 1)).t()  # transposed: non-contiguous
    assert not t.is_contiguous()
    allreduce(t, WORLD, algorithm)
    assert torch.equal(t, torch.full((5, 4), float(total)))

    m = torch.full((3, 4, 5), float(rank + 1), dtype=torch.float64)
    allreduce(m, WORLD, algorithm)
    assert m.shape == (3, 4, 5) and torch.equal(m, torch.full((3, 4, 5), float(total), dtype=torch.float64))


def test_tensor_that_requires_grad_is_reduced_in_place():
    p = torch.nn.Parameter(torch.full((10,), float(WORLD.Get_rank())))
    allreduce(p, WORLD, "ring")
    assert p.requires_grad
    assert torch.equal(p.detach(), torch.full((10,), float(sum(range(WORLD.Get_size())))))


@pytest.mark.parametrize("bad", ["rings", "", "MPI", None])
def test_unknown_algorithm_lists_the_valid_names(bad):
    with pytest.raises(ValueError, match="algorithm must be one of auto, native, ring"):
        allreduce(np.zeros(4), WORLD, bad)


@pytest.mark.parametrize("buf", [np.zeros(4, np.complex64), np.zeros(4, np.int8), np.zeros(4, bool),
                                 torch.zeros(4, dtype=torch.uint8)], ids=["complex64", "int8", "bool", "uint8"])
def test_unsupported_dtype_is_a_clear_error(buf):
    with pytest.raises(UnsupportedDtypeError, match="supported dtypes: float64, float32, float16, bfloat16"):
        allreduce(buf, WORLD, "ring")


@pytest.mark.parametrize("buf", [[1.0, 2.0], 3.0, "x"])
def test_non_array_is_a_clear_error(buf):
    with pytest.raises(TypeError, match="numpy.ndarray or torch.Tensor"):
        allreduce(buf, WORLD)


def test_read_only_array_is_a_clear_error():
    a = np.zeros(4)
    a.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        allreduce(a, WORLD, "ring")


def test_telemetry_records_one_comm_span_with_bytes():
    rec = Telemetry(rank=WORLD.Get_rank())
    buf = np.ones(1000, np.float32)
    with recording(rec):
        allreduce(buf, WORLD, "ring")
    allreduce(buf, WORLD, "ring")  # after the block: not recorded
    if WORLD.Get_size() == 1:
        assert rec.events == []  # nothing is communicated on one rank
        return
    assert len(rec.events) == 1
    (span,) = rec.events
    assert span["cat"] == "comm" and span["ph"] == "X" and span["pid"] == WORLD.Get_rank()
    assert span["args"]["bytes"] == 4000 and span["args"]["algorithm"] == "ring"
    assert span["dur"] > 0
    json.dumps(rec.chrome_trace())  # serialisable as a Chrome trace


def test_auto_decides_the_same_on_every_rank_and_persists():
    buf = np.ones(3000, np.float32)
    allreduce(buf, WORLD, "auto")
    if WORLD.Get_size() == 1:  # nothing to choose on one rank: no tuner, no measurement
        assert WORLD.Get_attr(_TUNER) is None and (buf == 1).all()
        return
    key = f"float32:{bucket_of(buf.nbytes)}"
    table = tuner_for(WORLD).table
    choices = WORLD.allgather(table[key]["algorithm"])
    assert len(set(choices)) == 1 and choices[0] in algorithm_names()
    assert set(table[key]["seconds"]) == set(algorithm_names()) - {"auto"}
    WORLD.Barrier()
    path = os.environ["WORKBENCH_TUNING_CACHE"]
    if WORLD.Get_rank() == 0:
        assert os.path.exists(path)
    again = Tuner(WORLD)  # a new process would build this: it must not measure again
    assert again.table[key]["algorithm"] == choices[0]


def test_tuning_repetitions_come_from_the_environment(monkeypatch):
    """``WORKBENCH_TUNING_REPS`` times each candidate that many rounds (the suite runs with 3);
    anything but a positive integer is refused, naming the variable."""
    calls = []
    monkeypatch.setattr("workbench.comm.tuning.time_interleaved",
                        lambda comm, ops, reps, warmup=1: calls.append(reps) or np.ones((len(ops), reps)))
    monkeypatch.setenv("WORKBENCH_TUNING_REPS", "2")
    Tuner(WORLD).measure(4096, "float32")
    monkeypatch.delenv("WORKBENCH_TUNING_REPS")
    Tuner(WORLD).measure(4096, "float32")
    assert calls == [2, 31]
    monkeypatch.setenv("WORKBENCH_TUNING_REPS", "0")
    with pytest.raises(ValueError, match="WORKBENCH_TUNING_REPS must be an integer >= 1; got '0'"):
        Tuner(WORLD).measure(4096, "float32")


def test_state_cached_on_a_communicator_dies_with_it():
    """Issue 11: the executor's duplicate and the tuning table were cached by handle, and MPI hands
    a freed communicator's handle to the next one: a run on 4 ranks after one on 2 found the
    2-rank duplicate ("Invalid rank"), and ``auto`` found a tuner whose communicator was freed."""
    rank, size = WORLD.Get_rank(), WORLD.Get_size()
    for i, members in enumerate([2, size, 1, max(size - 1, 1), size, 2]):
        members = min(members, size)
        comm = WORLD.Split(0 if rank < members else MPI.UNDEFINED, rank)
        if comm == MPI.COMM_NULL:
            continue
        assert private_comm(comm).Get_size() == members
        for algorithm, length in (("ring", 1001), ("auto", 1001), ("auto", 3000 + i), ("halving_doubling", 77)):
            buf = np.full(length, comm.Get_rank() + 1, np.float32)
            allreduce(buf, comm, algorithm)
            assert (buf == members * (members + 1) / 2).all(), (i, members, algorithm)
        if members > 1:
            assert tuner_for(comm).comm is comm
        comm.Free()
