"""Run on every rank under mpiexec by tests/test_mpi.py (``python -m mpi4py -m pytest this_file``).

The nonblocking all-reduce (:mod:`workbench.comm.nonblocking`) against the blocking one. Named
without the ``test_`` prefix so the outer, single-process pytest does not collect it. Bodies run
on COMM_SELF and COMM_WORLD where that makes sense. Every wait has a timeout: a bug fails a
case instead of hanging the job.
"""
from __future__ import annotations

from functools import partialmethod

import numpy as np
import pytest
import torch
from mpi4py import MPI

from workbench.collectives import algorithm_names, schedules
from workbench.comm import (Handle, LengthMismatchError, allreduce, iallreduce, progress,  # lazy names
                            waitall)
from workbench.comm.buffers import FlatBuffer
from workbench.comm.executor import private_comm
from workbench.comm.implementations import buffer_wire_bytes
from workbench.comm.mpi_allreduce import choose
from workbench.comm.tuning import Tuner
from workbench.telemetry import Telemetry, recording

# the value helpers of the blocking matrix (this folder is on sys.path under pytest)
from allreduce_cases import as_float64, integer_valued, make  # noqa: E402
from allreduce_cases import reference as exact  # noqa: E402

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
COMMS = {"self": MPI.COMM_SELF, "world": WORLD}
LENGTHS = [0, 1, 7, 1001, 4099]
CASES = [("numpy", "float32"), ("numpy", "float64"), ("numpy", "float16"), ("torch", "bfloat16"),
         ("numpy", "int64"), ("torch", "float32")]
WAIT = 60.0  # seconds: generous for 5 ranks on 2 cores, finite so a bug cannot hang the job


@pytest.fixture(autouse=True, scope="module")
def quick_tuning():
    """auto's first use of a (dtype, size) times every candidate; the table itself is tested in
    allreduce_cases.py, here auto only has to resolve alike in both paths: few repetitions."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Tuner, "measure", partialmethod(Tuner.measure, repetitions=3))
        yield


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("algorithm", algorithm_names())
@pytest.mark.parametrize("kind,dtype", CASES)
def test_iallreduce_equals_blocking_allreduce(comm_name, algorithm, kind, dtype):
    comm = COMMS[comm_name]
    for length in LENGTHS:
        values = integer_valued(length, comm.Get_rank())
        blocking = allreduce(make(kind, dtype, values), comm, algorithm)
        buf = make(kind, dtype, values)
        handle = iallreduce(buf, comm, algorithm)
        assert isinstance(handle, Handle) and handle.wait(timeout=WAIT) is buf and handle.done
        assert handle.test()
        np.testing.assert_array_equal(as_float64(buf), as_float64(blocking), err_msg=f"length {length}")
        np.testing.assert_array_equal(as_float64(buf), exact(comm, values), err_msg=f"length {length}")
        flat = FlatBuffer(buf)
        assert handle.nbytes == length * flat.itemsize and handle.requested == algorithm
        if comm.Get_size() > 1:
            ran = choose(flat, comm) if algorithm == "auto" else algorithm
            assert handle.algorithm == ran
            assert handle.wire_bytes == buffer_wire_bytes(flat, comm, ran)
        else:
            assert handle.wire_bytes == 0
    assert progress() == 0


def _mixed(comm, seed: int):
    """Eight handles' worth of (algorithm, buffer maker, values): mixed algorithms, lengths, dtypes."""
    specs = [("ring", "numpy", "float32", 4099), ("native", "torch", "bfloat16", 1001),
             ("halving_doubling", "numpy", "int64", 7), ("binary_tree", "numpy", "float64", 1001),
             ("auto", "numpy", "float32", 1001), ("recursive_doubling", "torch", "float32", 4099),
             ("double_binary_tree", "numpy", "float16", 13), ("linear", "numpy", "float64", 0)]
    return [(algorithm, kind, dtype, integer_valued(length, comm.Get_rank(), seed + i))
            for i, (algorithm, kind, dtype, length) in enumerate(specs)]


@pytest.mark.parametrize("comm_name", list(COMMS))
@pytest.mark.parametrize("order", ["rank_dependent", "shuffled"])
def test_several_outstanding_handles_waited_in_different_orders_on_different_ranks(comm_name, order):
    comm = COMMS[comm_name]
    allreduce(np.zeros(1001, np.float32), comm, "auto")  # auto's first use of the size is collective
    specs = _mixed(comm, seed=1)
    handles = [iallreduce(make(kind, dtype, values), comm, algorithm) for algorithm, kind, dtype, values in specs]
    assert progress(comm) <= len(handles)
    rng = np.random.default_rng(1000 + comm.Get_rank())
    indices = list(range(len(handles)))
    if order == "rank_dependent":
        indices = indices[::-1] if comm.Get_rank() % 2 else indices
    else:
        rng.shuffle(indices)
    for i in indices:
        handles[i].wait(timeout=WAIT)
    for handle, (algorithm, kind, dtype, values) in zip(handles, specs):
        np.testing.assert_array_equal(as_float64(handle.buf), exact(comm, values), err_msg=algorithm)
    assert progress() == 0


def test_handles_on_two_communicators_waited_in_opposite_orders():
    """Waiting one handle advances every handle, not only its communicator's: rank 0 waits on A
    while rank 1 waits on B, and both finish."""
    other = WORLD.Dup()
    a_values, b_values = integer_valued(4099, RANK, 3), integer_valued(1001, RANK, 4)
    a = iallreduce(a_values.copy(), WORLD, "ring")
    b = iallreduce(b_values.copy(), other, "binary_tree")
    for handle in ((a, b) if RANK % 2 else (b, a)):
        handle.wait(timeout=WAIT)
    np.testing.assert_array_equal(a.buf, exact(WORLD, a_values))
    np.testing.assert_array_equal(b.buf, exact(WORLD, b_values))
    other.Free()


@pytest.mark.parametrize("comm_name", list(COMMS))
def test_progress_between_issues_completes_handles_through_test(comm_name):
    comm = COMMS[comm_name]
    allreduce(np.zeros(1001, np.float32), comm, "auto")
    handles = []
    for algorithm, kind, dtype, values in _mixed(comm, seed=2):
        handles.append(iallreduce(make(kind, dtype, values), comm, algorithm))
        progress()  # what a backward hook does between buckets
        progress(comm)
    deadline = MPI.Wtime() + WAIT
    while not all([h.test() for h in handles]):
        assert MPI.Wtime() < deadline, [h for h in handles if not h.done]
    for handle, (algorithm, kind, dtype, values) in zip(handles, _mixed(comm, seed=2)):
        np.testing.assert_array_equal(as_float64(handle.buf), exact(comm, values), err_msg=algorithm)
    assert progress(comm) == 0 and progress() == 0


def test_waitall_returns_the_buffers_in_order():
    values = [integer_valued(n, RANK, n) for n in (5, 1001, 64)]
    bufs = [v.copy() for v in values]
    handles = [iallreduce(b, WORLD, a) for b, a in zip(bufs, ("native", "ring", "linear"))]
    out = waitall(handles, timeout=WAIT)
    assert all(o is b for o, b in zip(out, bufs)) and all(h.done for h in handles)
    for buf, v in zip(bufs, values):
        np.testing.assert_array_equal(buf, exact(WORLD, v))


def test_one_rank_is_done_at_issue():
    buf = np.arange(10.0)
    handle = iallreduce(buf, MPI.COMM_SELF, "auto")
    assert handle.done and handle.test() and handle.wait(timeout=0) is buf
    assert handle.algorithm == "native" and handle.wire_bytes == 0 and handle.nbytes == 80
    assert (buf == np.arange(10.0)).all()


@pytest.mark.parametrize("algorithm", ["ring", "native"])
def test_non_contiguous_and_bfloat16_buffers_reduce_in_place(algorithm):
    base = np.full((6, 8), 100.0)
    view = base[::2, 1::3]
    view[...] = RANK + 1
    t = torch.full((4, 5), float(RANK + 1), dtype=torch.bfloat16).t()  # non-contiguous bfloat16
    handles = [iallreduce(view, WORLD, algorithm), iallreduce(t, WORLD, algorithm)]
    waitall(handles, timeout=WAIT)
    total = SIZE * (SIZE + 1) / 2
    assert (view == total).all() and (base[1::2] == 100.0).all()
    assert torch.equal(t, torch.full((5, 4), total, dtype=torch.bfloat16))


def test_telemetry_records_one_comm_span_per_handle_from_issue_to_completion():
    rec = Telemetry(rank=RANK)
    with recording(rec):
        a = iallreduce(np.ones(1000, np.float32), WORLD, "ring")
        b = iallreduce(torch.ones(10, dtype=torch.bfloat16), WORLD, "native")
    waitall([b, a], timeout=WAIT)  # recorded: the recorder was active at issue
    if SIZE == 1:
        assert rec.events == []  # nothing is communicated on one rank
        return
    spans = {s["name"]: s for s in rec.events}
    assert set(spans) == {"iallreduce:ring", "iallreduce:native"} and len(rec.events) == 2
    ring, native = spans["iallreduce:ring"], spans["iallreduce:native"]
    assert ring["cat"] == "comm" and ring["dur"] > 0
    assert ring["args"] == {"bytes": 4000, "wire_bytes": a.wire_bytes, "algorithm": "ring", "requested": "ring",
                            "dtype": "float32"}
    assert native["args"]["bytes"] == 20 and native["args"]["dtype"] == "bfloat16"
    assert native["args"]["wire_bytes"] == round(2 * (SIZE - 1) / SIZE * 10 * 4)  # float32 on the wire


@pytest.mark.parametrize("algorithm", list(schedules.SCHEDULES))
def test_mismatched_lengths_raise_length_mismatch_on_some_rank(algorithm):
    if SIZE == 1:  # nothing to mismatch: done at issue (kept as a case so every rank count runs them all)
        assert iallreduce(np.ones(10, np.float32), WORLD, algorithm).done
        return
    handle = iallreduce(np.ones(10 + 3 * RANK, np.float32), WORLD, algorithm)
    raised = 0
    try:
        handle.wait(timeout=1.0)
    except LengthMismatchError as exc:
        raised = 1
        assert "ranks passed buffers of different lengths" in str(exc)
        with pytest.raises(LengthMismatchError):
            handle.test()  # a failed handle keeps saying so
    except TimeoutError:
        handle.cancel()  # a peer failed: the messages this rank waits for never come
        with pytest.raises(RuntimeError, match="cancelled"):
            handle.wait(timeout=0)
    assert WORLD.allreduce(raised) >= 1
    assert progress() == 0


@pytest.mark.parametrize("algorithm", ["native", "ring", "halving_doubling", "binary_tree", "auto"])
def test_wait_timeout_names_the_rank_then_the_handle_still_completes(algorithm):
    pair = WORLD.Split(RANK // 2, RANK)
    private_comm(pair)  # first use of a communicator is collective: do it before the ranks diverge
    buf = np.full(1001, pair.Get_rank() + 1.0, np.float32)
    allreduce(np.zeros_like(buf), pair, "auto")  # likewise auto's first use of the size
    if pair.Get_size() == 1:
        assert iallreduce(buf, pair, algorithm).wait(timeout=0) is buf
    elif pair.Get_rank() == 0:
        handle = iallreduce(buf, pair, algorithm)
        with pytest.raises(TimeoutError, match=rf"rank 0: iallreduce:{handle.algorithm} of 4004 bytes"):
            handle.wait(timeout=0.2)  # rank 1 has not issued yet
        assert not handle.done
        pair.send("issue now", dest=1, tag=7)
        handle.wait(timeout=WAIT)
        assert (buf == 3).all()
    else:
        pair.recv(source=0, tag=7)
        iallreduce(buf, pair, algorithm).wait(timeout=WAIT)
        assert (buf == 3).all()
    pair.Free()
