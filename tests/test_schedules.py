"""Schedules are data: every generator must compute an all-reduce for any rank count."""
from __future__ import annotations

import math

import pytest

from workbench.collectives import Schedule, ScheduleError, Transfer, chunk_bounds, schedules
from workbench.schedules.generators import double_binary_trees, nccl_btree

RANKS = range(1, 18)
ALL = sorted(schedules.SCHEDULES)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("nranks", RANKS)
def test_generator_validates(name, nranks):
    s = schedules.SCHEDULES[name](nranks)
    assert s.nranks == nranks and s.name == name
    assert s.validate() is s


@pytest.mark.parametrize("nranks", RANKS)
def test_ring_steps_and_traffic(nranks):
    s = schedules.ring(nranks)
    assert s.num_steps == 2 * (nranks - 1)
    assert s.nchunks == nranks
    # every rank sends exactly 2(n-1) chunks of size S/n: the bandwidth-optimal 2(n-1)/n S
    assert all(s.chunks_sent_by(r) == 2 * (nranks - 1) for r in range(nranks))
    assert all(len(step) == nranks for step in s.steps)  # every link busy every step


@pytest.mark.parametrize("nranks", [1, 2, 4, 8, 16])
def test_recursive_doubling_power_of_two_takes_log_steps(nranks):
    assert schedules.recursive_doubling(nranks).num_steps == int(math.log2(nranks))


@pytest.mark.parametrize("nranks", [3, 5, 6, 7, 12, 17])
def test_recursive_doubling_other_counts_fold_in_and_out(nranks):
    p = 1 << (nranks.bit_length() - 1)
    assert schedules.recursive_doubling(nranks).num_steps == int(math.log2(p)) + 2


@pytest.mark.parametrize("nranks", [2, 4, 8, 16])
def test_halving_doubling_steps_and_traffic(nranks):
    s = schedules.halving_doubling(nranks)
    assert s.num_steps == 2 * int(math.log2(nranks))
    # Rabenseifner: each rank sends (p-1)/p of the buffer in each phase
    assert all(s.chunks_sent_by(r) == 2 * (nranks - 1) for r in range(nranks))


@pytest.mark.parametrize("nranks", [3, 5, 12, 17])
def test_halving_doubling_non_power_of_two(nranks):
    p = 1 << (nranks.bit_length() - 1)
    s = schedules.halving_doubling(nranks)
    assert s.nchunks == p and s.num_steps == 2 * int(math.log2(p)) + 2


@pytest.mark.parametrize("nranks", [2, 3, 4, 7, 8, 15, 16, 17])
@pytest.mark.parametrize("nchunks", [1, 4, 8])
def test_binary_tree_pipeline_depth(nranks, nchunks):
    depth = max((v + 1).bit_length() - 1 for v in range(nranks))
    s = schedules.binary_tree(nranks, nchunks).validate()
    assert s.num_steps == nchunks + 2 * depth - 1


@pytest.mark.parametrize("nranks", range(2, 18))
def test_double_binary_tree_halves_are_complementary(nranks):
    first, second = double_binary_trees(nranks)
    for parents in (first, second):
        assert parents.count(-1) == 1  # one root each
    interior = [{p for p in parents if p >= 0} for parents in (first, second)]
    both = interior[0] & interior[1]
    # NCCL's property: with the mirror (even n) no rank is interior in both trees; the shift
    # used for odd n leaves at most one.
    assert len(both) == (0 if nranks % 2 == 0 else 1)
    s = schedules.double_binary_tree(nranks, 8).validate()
    tree_of_chunk = {t.chunk: (t.src, t.dst) for step in s.steps for t in step}
    assert set(tree_of_chunk) == set(range(8))


def test_nccl_btree_matches_reference_for_eight_ranks():
    # from NCCL's ncclGetBtree comments: 0 -> 4; 4 -> 2, 6; 2 -> 1, 3; 6 -> 5, 7
    assert nccl_btree(8, 0) == (-1, -1, 4)
    assert nccl_btree(8, 4) == (0, 2, 6)
    assert nccl_btree(8, 2) == (4, 1, 3)
    assert nccl_btree(8, 7) == (6, -1, -1)


@pytest.mark.parametrize("nranks", [1, 2, 5, 17])
def test_linear_is_the_sequential_baseline(nranks):
    s = schedules.linear(nranks)
    assert s.num_steps == 2 * (nranks - 1) and all(len(step) == 1 for step in s.steps)
    assert s.chunks_sent_by(0) == nranks - 1  # rank 0 sends the whole buffer n-1 times


def test_ring_order_is_respected():
    s = schedules.ring(4, order=[0, 2, 1, 3]).validate()
    pairs = {(t.src, t.dst) for step in s.steps for t in step}
    assert pairs == {(0, 2), (2, 1), (1, 3), (3, 0)}


@pytest.mark.parametrize("order", [[0, 1, 1, 3], [0, 1, 2], [1, 2, 3, 4]])
def test_ring_order_must_be_a_permutation(order):
    with pytest.raises(ValueError, match="permutation"):
        schedules.ring(4, order=order)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4"])
def test_bad_rank_count(bad):
    with pytest.raises(ValueError, match="nranks"):
        schedules.ring(bad)


def test_generators_are_cached():
    assert schedules.halving_doubling(6) is schedules.halving_doubling(6)


@pytest.mark.parametrize("length,nchunks", [(0, 3), (2, 5), (10, 3), (17, 17), (1000, 7)])
def test_chunk_bounds_cover_exactly(length, nchunks):
    bounds = chunk_bounds(length, nchunks)
    assert len(bounds) == nchunks and bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


# --- validate() must catch broken schedules ------------------------------------------------

def _sched(n, k, steps):
    return Schedule("hand-made", n, k, tuple(tuple(Transfer(*t) for t in s) for s in steps))


def test_validate_catches_double_counting():
    # 0 -> 1 twice: rank 0's contribution lands in rank 1 two times
    s = _sched(2, 1, [[(0, 1, 0, True)], [(0, 1, 0, True)]])
    with pytest.raises(ScheduleError, match="double counting of rank"):
        s.validate()


def test_validate_catches_missing_contribution():
    # only rank 1 gets the sum; rank 0 never hears from rank 1
    s = _sched(2, 1, [[(0, 1, 0, True)]])
    with pytest.raises(ScheduleError, match=r"rank 0 chunk 0 lacks the contribution of rank\(s\) \[1\]"):
        s.validate()


def test_validate_catches_conflicting_copies():
    s = _sched(3, 1, [[(0, 2, 0, True)], [(1, 2, 0, False), (0, 2, 0, False)]])
    with pytest.raises(ScheduleError, match="conflicting writes"):
        s.validate()


def test_validate_catches_copy_and_reduce_into_same_place():
    s = _sched(3, 1, [[(1, 2, 0, True), (0, 2, 0, False)]])
    with pytest.raises(ScheduleError, match="conflicting writes"):
        s.validate()


def test_validate_uses_pre_step_values():
    # A pairwise exchange in one step is correct only with pre-step reads; applied
    # sequentially it would double count.
    ok = _sched(2, 1, [[(0, 1, 0, True), (1, 0, 0, True)]])
    ok.validate()
    # Two steps of the same exchange: the second double counts.
    with pytest.raises(ScheduleError, match="double counting"):
        _sched(2, 1, [[(0, 1, 0, True), (1, 0, 0, True)], [(0, 1, 0, True)]]).validate()


def test_validate_rejects_out_of_range_and_self_sends():
    with pytest.raises(ScheduleError, match="rank out of range"):
        _sched(2, 1, [[(0, 2, 0, True)]]).validate()
    with pytest.raises(ScheduleError, match="chunk out of range"):
        _sched(2, 1, [[(0, 1, 1, True)]]).validate()
    with pytest.raises(ScheduleError, match="itself"):
        _sched(2, 1, [[(1, 1, 0, True)]]).validate()


def test_ring_with_a_step_removed_is_caught():
    good = schedules.ring(5)
    for drop in range(good.num_steps):
        broken = Schedule("broken", 5, 5, good.steps[:drop] + good.steps[drop + 1:])
        with pytest.raises(ScheduleError):
            broken.validate()


def test_the_old_name_of_the_schedule_table_warns_and_is_the_same_table():
    import subprocess
    import sys
    code = ("import warnings, workbench.schedules as s\nwarnings.simplefilter('error')\n"
            "try:\n    s.ALGORITHMS\nexcept DeprecationWarning as w:\n    print(w)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "now SCHEDULES" in out
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from workbench.schedules import generators
        assert generators.ALGORITHMS is schedules.SCHEDULES
