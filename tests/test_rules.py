"""The update rules against the formulas of docs/papers.md, "1. EASGD for HPC clusters", by hand on small tensors."""
import pytest
import torch

from workbench.lr_schedules import scheduled_lr
from workbench.optim import rules

x = torch.tensor([1.0, -2.0, 3.0])
g = torch.tensor([0.5, 0.5, -1.0])
c = torch.tensor([0.0, 1.0, 2.0])
v = torch.tensor([0.1, -0.1, 0.0])
LR, RHO, MU = 0.1, 2.0, 0.9


def test_elastic_worker():
    # x - lr*g - lr*rho*(x - c)
    expected = torch.tensor([1 - 0.05 - 0.2 * 1, -2 - 0.05 - 0.2 * -3, 3 + 0.1 - 0.2 * 1])
    assert torch.allclose(rules.elastic_worker(x, g, c, LR, RHO), expected)


def test_elastic_center_one_arrival():
    # c + lr*rho*(x - c)
    expected = torch.tensor([0.2, 1 + 0.2 * -3, 2 + 0.2])
    assert torch.allclose(rules.elastic_center(c, x, LR, RHO), expected)


def test_elastic_center_sync_equals_sum_of_single_updates_form():
    xs = [x, x * 2, -x]
    mean = sum(xs) / 3
    expected = c + LR * RHO * sum(xi - c for xi in xs)  # = c + alpha * sum(x_i - c)
    assert torch.allclose(rules.elastic_center_sync(c, mean, LR, RHO, 3), expected)


def test_momentum_elastic_worker():
    new_x, new_v = rules.momentum_elastic_worker(x, v, g, c, LR, RHO, MU)
    assert torch.allclose(new_v, MU * v - LR * g)
    assert torch.allclose(new_x, x + (MU * v - LR * g) - LR * RHO * (x - c))


def test_sgd_and_momentum_sgd():
    assert torch.allclose(rules.sgd(x, g, LR), x - LR * g)
    new_x, new_v = rules.momentum_sgd(x, v, g, LR, MU)
    assert torch.allclose(new_v, MU * v - LR * g) and torch.allclose(new_x, x + new_v)


def test_rho_zero_decouples_worker_and_center():
    assert torch.equal(rules.elastic_worker(x, g, c, LR, 0.0), rules.sgd(x, g, LR))
    assert torch.equal(rules.elastic_center(c, x, LR, 0.0), c)


@pytest.mark.parametrize("call", [
    lambda: rules.elastic_worker(x, g, c, LR, RHO),
    lambda: rules.elastic_center(c, x, LR, RHO),
    lambda: rules.elastic_center_sync(c, x, LR, RHO, 4),
    lambda: rules.momentum_elastic_worker(x, v, g, c, LR, RHO, MU),
    lambda: rules.momentum_sgd(x, v, g, LR, MU),
])
def test_rules_are_pure(call):
    before = [t.clone() for t in (x, g, c, v)]
    call()
    assert all(torch.equal(a, b) for a, b in zip(before, (x, g, c, v)))


def test_exposed_communication_counts_overlap_once_and_hides_compute():
    from workbench.telemetry import busy_seconds, exposed_comm_seconds
    us = 1e6
    events = [
        {"cat": "comm", "ts": 0, "dur": 4 * us},      # 0-4 s, a comm thread ...
        {"cat": "compute", "ts": 1 * us, "dur": 2 * us},  # ... hidden 1-3 s by compute
        {"cat": "wait", "ts": 3.5 * us, "dur": 1.5 * us},  # 3.5-5 s overlaps the comm span
        {"cat": "wait", "ts": 3.5 * us, "dur": 1.5 * us},  # a second thread waiting alike
        {"cat": "io", "ts": 6 * us, "dur": 1 * us},
    ]
    assert busy_seconds(events, ("comm", "wait")) == pytest.approx(5.0)
    assert exposed_comm_seconds(events) == pytest.approx(3.0)  # 0-1 and 3-5


@pytest.mark.parametrize("schedule,done,expected", [
    ("constant", 0, 0.1), ("constant", 99, 0.1),
    ("cosine", 0, 0.1), ("cosine", 50, 0.05), ("cosine", 100, 0.0), ("cosine", 25, 0.1 * (1 + 2 ** -0.5) / 2),
    ("step", 49, 0.1), ("step", 50, 0.01), ("step", 74, 0.01), ("step", 75, 0.001), ("step", 99, 0.001)])
def test_scheduled_lr(schedule, done, expected):
    assert scheduled_lr(0.1, schedule, done, 100) == pytest.approx(expected, abs=1e-15)


def test_the_constant_schedule_is_the_lr_itself_and_an_unknown_one_is_refused():
    assert scheduled_lr(0.3, "constant", 7, 10) is 0.3  # the same float: runs stay bit for bit
    with pytest.raises(ValueError, match="lr_schedule must be one of constant, cosine, step, got 'linear'"):
        scheduled_lr(0.1, "linear", 1, 10)


def _random(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen) for _ in range(4)]


#: (functional call, in-place call, which of (x, v, c) the in-place form updates): each twin on
#: fresh copies must give the functional form's bits exactly
TWINS = {
    "sgd": (lambda x, v, g, c: (rules.sgd(x, g, 0.03),),
            lambda x, v, g, c, s1, s2: rules.sgd_(x, g, 0.03, s1), "x"),
    "momentum_sgd": (lambda x, v, g, c: rules.momentum_sgd(x, v, g, 0.03, 0.9),
                     lambda x, v, g, c, s1, s2: rules.momentum_sgd_(x, v, g, 0.03, 0.9, s1), "xv"),
    "elastic_worker": (lambda x, v, g, c: (rules.elastic_worker(x, g, c, 0.03, 0.7),),
                       lambda x, v, g, c, s1, s2: rules.elastic_worker_(x, g, c, 0.03, 0.7, s1, s2), "x"),
    "momentum_elastic_worker": (
        lambda x, v, g, c: rules.momentum_elastic_worker(x, v, g, c, 0.03, 0.7, 0.9),
        lambda x, v, g, c, s1, s2: rules.momentum_elastic_worker_(x, v, g, c, 0.03, 0.7, 0.9, s1, s2), "xv"),
    "elastic_center": (lambda x, v, g, c: (rules.elastic_center(c, x, 0.03, 0.7),),
                       lambda x, v, g, c, s1, s2: rules.elastic_center_(c, x, 0.03, 0.7, s1), "c"),
    "elastic_center_sync": (lambda x, v, g, c: (rules.elastic_center_sync(c, x, 0.03, 0.7, 3),),
                            lambda x, v, g, c, s1, s2: rules.elastic_center_sync_(c, x, 0.03, 0.7, 3, s1), "c"),
    # DiLoCo's outer step (theta = c, its momentum = v, the outer gradient = g) and Streaming DiLoCo's mix
    "outer_sgd_nesterov": (lambda x, v, g, c: rules.outer_sgd(c, v, g, 0.7, 0.9, True),
                           lambda x, v, g, c, s1, s2: rules.outer_sgd_(c, v, g, 0.7, 0.9, True, s1), "cv"),
    "outer_sgd": (lambda x, v, g, c: rules.outer_sgd(c, v, g, 0.7, 0.9, False),
                  lambda x, v, g, c, s1, s2: rules.outer_sgd_(c, v, g, 0.7, 0.9, False, s1), "cv"),
    "mix": (lambda x, v, g, c: (rules.mix(x, c, 0.3),), lambda x, v, g, c, s1, s2: rules.mix_(x, c, 0.3, s1), "x"),
}


@pytest.mark.parametrize("name", sorted(TWINS) + ["adamw"])
@pytest.mark.parametrize("n", [1, 37, 4099])  # the vectorised loops' tails and bodies
def test_each_in_place_twin_gives_the_functional_forms_bits(name, n):
    x, v, g, c = _random(n, seed=n)
    s1, s2 = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))  # scratch contents must not matter
    if name == "adamw":
        m = torch.rand(n) * 0.1
        v = v.abs()
        want = rules.adamw(x, m, v, g, 3, 0.01, 0.1)
        got = [x.clone(), m.clone(), v.clone()]
        rules.adamw_(*got, g.clone(), 3, 0.01, 0.1, s1, s2)
    else:
        functional, in_place, updated = TWINS[name]
        want = functional(x, v, g, c)
        mine = {"x": x.clone(), "v": v.clone(), "c": c.clone()}
        in_place(mine["x"], mine["v"], g.clone(), mine["c"], s1, s2)
        got = [mine[k] for k in updated]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a, b), (name, n, (a - b).abs().max())
