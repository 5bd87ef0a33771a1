"""The pure parts of GradientFlow's strategies, in one process (no mpiexec): fusion's bucket
bounds, CSC's warm-up schedule, the share of CSC's sent sum carried on as momentum, and the
options' validation messages. The collective parts run
under mpiexec in tests/mpi/strategy_cases.py (tests/test_mpi.py)."""
from __future__ import annotations

import math
import re

import pytest

from workbench.comm.options import (DEFAULT_SPARSE_CHUNK, FIELDS, PRESETS, Communication, CommunicationError,
                                    resolve, warmup_ratio)
from workbench.comm.strategies import bucket_bounds


def layout(*sizes: int) -> list[tuple[int, int]]:
    """Parameters' (start, stop) element ranges in registration order, as FlatParams lays them."""
    bounds, offset = [], 0
    for n in sizes:
        bounds.append((offset, offset + n))
        offset += n
    return bounds


# -- bucket_bounds -------------------------------------------------------------------------------

def test_zero_threshold_is_one_bucket_per_parameter_in_backward_order():
    assert bucket_bounds(layout(3, 5, 2), 0) == [(8, 10, (2,)), (3, 8, (1,)), (0, 3, (0,))]


def test_no_threshold_is_one_bucket_of_everything():
    assert bucket_bounds(layout(3, 5, 2), None) == [(0, 10, (2, 1, 0))]


def test_a_bucket_closes_once_it_reaches_the_threshold():
    # backward order 10, 20, 30, 5 elements = 40, 80, 120, 20 bytes; theta 100 bytes: 40 + 80,
    # then 120 alone, then the 20 left over (the last bucket may stay below theta)
    assert bucket_bounds(layout(5, 30, 20, 10), 100) == [(35, 65, (3, 2)), (5, 35, (1,)), (0, 5, (0,))]
    # exactly theta closes the bucket (>=)
    assert bucket_bounds(layout(1, 25, 25), 100) == [(26, 51, (2,)), (1, 26, (1,)), (0, 1, (0,))]


@pytest.mark.parametrize("theta", [1, 7, 64, 100, 400, 10_000])
def test_buckets_tile_the_pool_and_each_but_the_last_reaches_the_threshold(theta):
    sizes = [17, 1, 64, 3, 250, 9, 0, 40]
    bounds = layout(*sizes)
    buckets = bucket_bounds(bounds, theta)
    assert [p for _, _, params in buckets for p in params] == list(reversed(range(len(sizes))))
    assert buckets[0][1] == sum(sizes) and buckets[-1][0] == 0
    assert all(later[1] == earlier[0] for earlier, later in zip(buckets, buckets[1:]))  # contiguous
    for start, stop, params in buckets[:-1]:
        assert (stop - start) * 4 >= theta
        assert sum(bounds[p][1] - bounds[p][0] for p in params[:-1]) * 4 < theta  # closed at once
    for start, stop, params in buckets:
        assert (start, stop) == (min(bounds[p][0] for p in params), max(bounds[p][1] for p in params))


def test_threshold_above_the_pool_is_one_bucket():
    assert bucket_bounds(layout(3, 5), 1 << 30) == [(0, 8, (1, 0))]


def test_itemsize_scales_the_threshold():
    bounds = layout(10, 10, 10)
    assert bucket_bounds(bounds, 80, itemsize=8) == bucket_bounds(bounds, 40, itemsize=4) == [
        (20, 30, (2,)), (10, 20, (1,)), (0, 10, (0,))]
    assert bucket_bounds(bounds, 80, itemsize=4) == [(10, 30, (2, 1)), (0, 10, (0,))]


def test_empty_parameters_and_no_parameters():
    assert bucket_bounds([], 0) == [] and bucket_bounds([], None) == [] and bucket_bounds([], 100) == []
    # a parameter of no elements is a bucket of its own at theta 0 (0 bytes >= 0), otherwise it joins one
    assert bucket_bounds(layout(4, 0, 4), 0) == [(4, 8, (2,)), (4, 4, (1,)), (0, 4, (0,))]
    assert bucket_bounds(layout(4, 0, 4), 16) == [(4, 8, (2,)), (0, 4, (1, 0))]
    assert bucket_bounds(layout(0), 16) == [(0, 0, (0,))]


# -- warmup_ratio ------------------------------------------------------------------------------------

def test_no_warm_up_is_the_final_ratio_from_the_start():
    assert all(warmup_ratio(0.1, epoch, 0) == 0.1 for epoch in (0, 0.5, 1, 7.3))


def test_warm_up_is_dense_for_an_epoch_then_falls_geometrically_to_the_final_ratio():
    final, warm = 0.001, 3
    assert warmup_ratio(final, 0.0, warm) == warmup_ratio(final, 0.99, warm) == 1.0
    assert warmup_ratio(final, 1.0, warm) == pytest.approx(final ** (1 / 3))  # 0.1
    assert warmup_ratio(final, 1.7, warm) == pytest.approx(0.1)  # constant within an epoch
    assert warmup_ratio(final, 2.0, warm) == pytest.approx(0.01)
    assert warmup_ratio(final, 3.0, warm) == warmup_ratio(final, 99, warm) == final


def test_one_warm_up_epoch_is_dense_then_final():
    assert warmup_ratio(0.1, 0.5, 1) == 1.0 and warmup_ratio(0.1, 1.0, 1) == 0.1


def test_warm_up_ratio_never_rises_and_stays_in_range():
    ratios = [warmup_ratio(0.05, e / 4, 4) for e in range(0, 30)]
    assert all(a >= b for a, b in zip(ratios, ratios[1:]))
    assert all(0.05 <= r <= 1.0 for r in ratios) and ratios[0] == 1.0 and ratios[-1] == 0.05
    assert all(warmup_ratio(1.0, e / 3, 5) == 1.0 for e in range(30))  # final 1: dense throughout


# -- CSC's and wire precision's kernels: the same results as the plain definitions ----------------
@pytest.mark.parametrize("n, c", [(1, 4), (64, 8), (67, 8), (200_003, 64)])
def test_chunk_norms_are_each_chunks_l1_norm_the_tail_over_its_own_elements(n, c):
    import torch

    from workbench.comm.csc import NORM_BLOCK, chunk_norms
    torch.manual_seed(n)
    v = torch.randn(n)
    expected = torch.stack([v[i:i + c].abs().sum() for i in range(0, n, c)])
    assert n < NORM_BLOCK or n // c > NORM_BLOCK // c  # the largest case spans several blocks
    assert torch.equal(chunk_norms(v, c), expected)


def test_top_chunks_are_a_stable_sorts_first_keep_ties_nan_and_inf_included():
    import torch

    from workbench.comm.csc import top_chunks

    def by_sort(norms, keep):
        order = torch.sort(norms, descending=True, stable=True).indices
        return torch.sort(order[:keep]).values

    generator = torch.Generator().manual_seed(0)
    for trial in range(400):
        n = int(torch.randint(1, 300, (1,), generator=generator))
        norms = (torch.randint(0, 4, (n,), generator=generator).double() if trial % 2  # many ties
                 else torch.rand(n, generator=generator, dtype=torch.float64))
        if trial % 7 == 0:
            norms[torch.randint(0, n, (2,), generator=generator)] = float("nan")
        if trial % 5 == 0:
            norms[torch.randint(0, n, (2,), generator=generator)] = float("inf")
        keep = int(torch.randint(1, n + 1, (1,), generator=generator))
        assert torch.equal(top_chunks(norms, keep), by_sort(norms, keep)), (trial, n, keep)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_finite_finds_an_inf_or_a_nan_anywhere(dtype):
    import torch

    from workbench.comm.precision import finite
    t = torch.randn(1001).to(getattr(torch, dtype))
    assert finite(t) and finite(t[:0])
    for bad in (float("inf"), -float("inf"), float("nan")):
        for where in (0, 500, 1000):
            u = t.clone()
            u[where] = bad
            assert not finite(u), (bad, where)


# -- carried_share: the momentum in CSC's sent accumulator ----------------------------------------

@pytest.mark.parametrize("momentum", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("interval", [1, 2, 3, 10, 37])
def test_carried_share_is_the_momentum_in_the_accumulator_at_a_constant_gradient(momentum, interval):
    """DGC's accumulation at a constant gradient g = 1, from u = v = 0 (just sent): after T steps
    psi(T) of v is u, and v plus what momentum SGD would still apply of u (m/(1 - m) u) is
    T/(1 - m): momentum SGD's T steps. gain(T) = 1 - m(1 - m^T)/(T(1 - m)) is what v alone is."""
    from workbench.comm.csc import carried_share
    u = v = 0.0
    for _ in range(interval):
        u = momentum * u + 1.0
        v += u
    psi = carried_share(interval, momentum)
    assert psi * v == pytest.approx(u, rel=1e-12)
    assert v + momentum / (1 - momentum) * psi * v == pytest.approx(interval / (1 - momentum), rel=1e-12)
    gain = 1 - momentum * (1 - momentum ** interval) / (interval * (1 - momentum))
    assert v * (1 - momentum) / interval == pytest.approx(gain, rel=1e-12)


def test_carried_share_is_all_of_a_dense_step_and_falls_with_the_interval():
    from workbench.comm.csc import carried_share
    assert carried_share(1, 0.9) == pytest.approx(1.0, rel=1e-15)
    shares = [carried_share(t, 0.9) for t in (1, 2, 5, 10, 100, 1000)]
    assert shares == sorted(shares, reverse=True) and 0 < shares[-1] < 0.002
    assert carried_share(10, 0.9) == pytest.approx(0.1574, abs=1e-4)


# -- Communication ----------------------------------------------------------------------------------

def test_defaults_are_dense_fp32_in_one_message():
    c = Communication()
    assert c.dense_default and not c.sparse and c.fusion_bytes is None and not c.overlap
    assert c.wire_dtype == "fp32" and c.wire_itemsize == 4 and c.wire_torch_dtype == "float32"
    assert c.sparse_chunk == DEFAULT_SPARSE_CHUNK and c.residual and c.momentum_correction and c.carry_momentum
    assert c.describe() == "one message per step, fp32"
    assert set(c.to_dict()) == set(FIELDS)


def test_derived_properties():
    assert Communication(wire_dtype="fp16").wire_itemsize == 2
    assert Communication(wire_dtype="bf16").wire_torch_dtype == "bfloat16"
    c = Communication(sparse_ratio=1)
    assert c.sparse and c.sparse_ratio == 1.0 and isinstance(c.sparse_ratio, float)
    assert not Communication(fusion_bytes=0).dense_default
    assert Communication(fusion_bytes=0).describe() == "one message per tensor, fp32"
    text = Communication(sparse_ratio=0.1, sparse_chunk=32, warmup_epochs=2, residual=False,
                         momentum_correction=False, overlap=True).describe()
    assert text == "one message per step, overlap, fp32, CSC rho=0.1 c=32 warm-up 2 no residual no momentum correction"
    dgc = Communication(sparse_ratio=0.1, carry_momentum=False).describe()
    assert dgc == "one message per step, fp32, CSC rho=0.1 c=64 masked momentum dropped"
    clipped = Communication(sparse_ratio=0.01, warmup_epochs=1, clip_norm=1)
    assert clipped.clip_norm == 1.0 and isinstance(clipped.clip_norm, float)
    assert clipped.describe() == "one message per step, fp32, CSC rho=0.01 c=64 warm-up 1 clip 1"


FUSION = re.escape("fusion_bytes must be an integer >= 0 (bytes; 0 = one message per tensor) "
                   "or None (one message per step)")
RATIO = re.escape("sparse_ratio must be a number in (0, 1] (the share of chunks sent) or None (dense)")
CLIP = re.escape("clip_norm must be a number > 0 (the L2 norm the ranks' gradients are clipped to, together) "
                 "or None (no clipping)")


@pytest.mark.parametrize("options,message", [
    ({"fusion_bytes": -1}, FUSION + "; got -1"),
    ({"fusion_bytes": 1.5}, FUSION + "; got 1.5"),
    ({"fusion_bytes": True}, FUSION + "; got True"),
    ({"fusion_bytes": "1M"}, FUSION + "; got '1M'"),
    ({"overlap": 1}, "overlap must be true or false; got 1"),
    ({"sparse_ratio": 0.1, "residual": "yes"}, "residual must be true or false; got 'yes'"),
    ({"sparse_ratio": 0.1, "momentum_correction": None}, "momentum_correction must be true or false; got None"),
    ({"sparse_ratio": 0.1, "carry_momentum": 0}, "carry_momentum must be true or false; got 0"),
    ({"wire_dtype": "fp8"}, "wire_dtype must be one of fp32, fp16, bf16; got 'fp8'"),
    ({"wire_dtype": "float16"}, "wire_dtype must be one of fp32, fp16, bf16; got 'float16'"),
    ({"sparse_ratio": 0}, RATIO + "; got 0"),
    ({"sparse_ratio": -0.1}, RATIO + "; got -0.1"),
    ({"sparse_ratio": 1.5}, RATIO + "; got 1.5"),
    ({"sparse_ratio": math.nan}, RATIO + "; got nan"),
    ({"sparse_ratio": math.inf}, RATIO + "; got inf"),
    ({"sparse_ratio": True}, RATIO + "; got True"),
    ({"sparse_ratio": "0.1"}, RATIO + "; got '0.1'"),
    ({"sparse_ratio": 0.1, "sparse_chunk": 0}, r"sparse_chunk must be an integer >= 1 \(elements\); got 0"),
    ({"sparse_ratio": 0.1, "sparse_chunk": 2.0}, r"sparse_chunk must be an integer >= 1 \(elements\); got 2.0"),
    ({"sparse_ratio": 0.1, "sparse_chunk": True}, r"sparse_chunk must be an integer >= 1 \(elements\); got True"),
    ({"sparse_ratio": 0.1, "warmup_epochs": -1}, "warmup_epochs must be an integer >= 0; got -1"),
    ({"sparse_ratio": 0.1, "warmup_epochs": 0.5}, "warmup_epochs must be an integer >= 0; got 0.5"),
    ({"sparse_ratio": 0.1, "clip_norm": 0}, CLIP + "; got 0"),
    ({"sparse_ratio": 0.1, "clip_norm": -1.0}, CLIP + "; got -1.0"),
    ({"sparse_ratio": 0.1, "clip_norm": math.nan}, CLIP + "; got nan"),
    ({"sparse_ratio": 0.1, "clip_norm": math.inf}, CLIP + "; got inf"),
    ({"sparse_ratio": 0.1, "clip_norm": True}, CLIP + "; got True"),
    ({"sparse_ratio": 0.1, "clip_norm": "1"}, CLIP + "; got '1'"),
])
def test_bad_options_are_refused_with_a_message_naming_them(options, message):
    with pytest.raises(CommunicationError, match=f"^{message}$"):
        Communication(**options)


@pytest.mark.parametrize("name,value", [("warmup_epochs", 1), ("residual", False), ("momentum_correction", False),
                                        ("carry_momentum", False), ("sparse_chunk", DEFAULT_SPARSE_CHUNK + 1),
                                        ("clip_norm", 0.5)])
def test_csc_options_need_a_sparse_ratio(name, value):
    with pytest.raises(CommunicationError, match=rf"^{name} is an option of coarse-grained sparse communication; "
                                                 r"set sparse_ratio \(in \(0, 1\]\) to use it$"):
        Communication(**{name: value})
    assert getattr(Communication(sparse_ratio=0.5, **{name: value}), name) == value


def test_communication_error_is_a_value_error():
    assert issubclass(CommunicationError, ValueError)


def test_presets_are_valid_and_resolve_to_copies():
    for name, options in PRESETS.items():
        Communication(**resolve(name))
        assert resolve(name) == options and resolve(name) is not options
    assert resolve(None) == {} and resolve({"overlap": True}) == {"overlap": True}
    with pytest.raises(CommunicationError, match="communication must be one of dense, .* got 'nope'"):
        resolve("nope")
    with pytest.raises(CommunicationError, match=r"unknown option\(s\) \['x'\]"):
        resolve({"x": 1, "overlap": True})
    with pytest.raises(CommunicationError, match="got int"):
        resolve(3)


def test_the_hook_registry_names_each_strategy():
    from workbench.comm.strategies import HOOKS, allreduce_hook, csc_hook, hook_name
    assert HOOKS == {"allreduce": allreduce_hook, "csc": csc_hook}
    assert hook_name(Communication()) == "allreduce" and hook_name(Communication(wire_dtype="fp16")) == "allreduce"
    assert hook_name(Communication(sparse_ratio=0.1)) == "csc"
