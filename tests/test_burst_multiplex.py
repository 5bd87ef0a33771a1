"""DeepPool's GPU multiplexing as a discrete-event simulation (workbench.burst.multiplex)."""
from __future__ import annotations

import random

import pytest

from workbench.burst.graph import BurstError
from workbench.burst.multiplex import busy_spans, simulate
from workbench.burst.pictures import fill_figure
from workbench.burst.plan import BurstPlan, LayerPlan

EPS = 1e-7


def chain(layers, gpus=8, batch=32, iteration=None, gaps=None):
    """A hand-built plan: ``layers`` = [(ranks, transfer_ms, compute_ms, sync_ms)], run one after
    another (plus ``gaps[i]`` ms of nothing before layer i)."""
    out, t = [], 0.0
    for i, (ranks, tr, co, sy) in enumerate(layers):
        t += (gaps or [0.0] * len(layers))[i]
        ranks = tuple(range(ranks)) if isinstance(ranks, int) else tuple(ranks)
        out.append(LayerPlan(i, "conv", len(ranks), ranks, batch // len(ranks), co, sy, tr, t, t + tr + co + sy))
        t += tr + co + sy
    used = 1 + max(r for l in out for r in l.ranks)
    return BurstPlan("toy", batch, gpus, "workbench", out, iteration or t, 0.0, used)


def demo():
    """8 GPUs, layers 8, 2, 1, 8 wide (the report's demonstration)."""
    return chain([(8, 0.0, 3.0, 0.6), (2, 0.4, 3.2, 0.3), (1, 0.3, 2.4, 0.0), (8, 0.4, 1.6, 0.5)])


def gappy():
    """Uneven windows, a gap where no GPU works, ranks not starting at 0, trailing idle time."""
    return chain([(4, 0.0, 1.3, 0.2), ([2, 3], 0.1, 0.7, 0.0), ([5], 0.0, 0.9, 0.0), (6, 0.2, 1.1, 0.3)],
                 gpus=6, gaps=[0.0, 0.0, 0.35, 0.0], iteration=6.3)


def random_plan(seed):
    rng = random.Random(seed)
    n, layers, gaps = rng.choice([2, 4, 8]), [], []
    for _ in range(rng.randint(2, 5)):
        w = rng.choice([x for x in (1, 2, 4, 8) if x <= n])
        off = rng.randint(0, n - w)
        layers.append((list(range(off, off + w)), rng.choice([0.0, 0.2]), rng.uniform(0.2, 2.0), 0.0))
        gaps.append(rng.choice([0.0, 0.0, 0.3]))
    p = chain(layers, gpus=n, gaps=gaps)
    p.iteration_ms += rng.choice([0.0, 0.5])
    return p


def check_schedule(plan, r, switch_ms=0.0):
    """Pieces lie in idle time (never on top of the foreground, switches included), never overlap
    each other, every iteration keeps to the bound, and overruns are accounted."""
    T, bound = plan.iteration_ms, r.slowdown_bound
    assert all(t <= bound * T * (1 + 1e-9) for t in r.iteration_times_ms)
    assert r.wall_ms == pytest.approx(sum(r.iteration_times_ms))
    spans = busy_spans(plan)
    for g in range(r.gpus):
        fg = sorted((s.start_ms, s.end_ms, "fg") for s in r.foreground if s.gpu == g)
        # the realised foreground is the plan's, shifted by the delays so far
        assert len(fg) == len(spans[g]) * r.iterations
        bg = sorted((p.start_ms, p.end_ms, "bg") for p in r.pieces if p.gpu == g)
        items = sorted(fg + bg)
        for a, b in zip(items, items[1:]):
            gap = switch_ms if a[2] != b[2] else 0.0
            assert b[0] >= a[1] + gap - EPS, (g, a, b)
        for p in r.pieces:
            if p.gpu != g:
                continue
            po, pc = p.window
            assert pc >= po  # its window, in planned time, is idle in the plan (shifted by k iterations)
            for k in range(r.iterations + 1):
                for s, e, _ in spans[g]:
                    assert e + k * T <= po + EPS or s + k * T >= pc - EPS, (p, s, e, k)
            assert p.overrun_ms <= (bound - 1) * T + EPS
    for k in range(r.iterations):  # what each iteration was charged, at most what its pieces predicted
        charged = r.iteration_times_ms[k] - T
        assert charged <= sum(p.overrun_ms for p in r.pieces if p.iteration == k) + EPS
        assert charged <= (bound - 1) * T + EPS


@pytest.mark.parametrize("make", [demo, gappy])
@pytest.mark.parametrize("slowdown", [1.0, 1.1, 1.3])
def test_pieces_only_in_idle_time_and_bound_holds(make, slowdown):
    plan = make()
    r = simulate(plan, 10.3, piece_ms=0.45, slowdown=slowdown, iterations=6)
    assert r.pieces
    check_schedule(plan, r)
    if slowdown == 1.0:  # no delay at all: the plan's own idle windows, exactly
        assert r.iteration_times_ms == [plan.iteration_ms] * 6 and all(p.overrun_ms == 0 for p in r.pieces)
        windows = plan.idle_windows()
        T = plan.iteration_ms
        for p in r.pieces:
            k = int(p.start_ms // T)
            local = [(a + k * T, b + k * T) for a, b in windows[p.gpu]] + [
                (a + (k + 1) * T, b + (k + 1) * T) for a, b in windows[p.gpu]]
            merged = []  # idle windows meet across the iteration boundary
            for a, b in sorted(local):
                if merged and a <= merged[-1][1] + EPS:
                    merged[-1] = (merged[-1][0], b)
                else:
                    merged.append((a, b))
            assert any(a - EPS <= p.start_ms and p.end_ms <= b + EPS for a, b in merged), p


def test_iteration_starts_keep_the_bound():
    plan = chain([(2, 0.0, 1.0, 0.0), ([0], 0.0, 1.0, 0.0), (2, 0.0, 1.0, 0.0)], gpus=2)
    r = simulate(plan, 0.7, piece_ms=0.7, slowdown=1.2, iterations=8)
    # GPU 1's 1 ms window holds one 0.7 ms piece; a second one overruns by 0.4 ms <= 0.2 * 3 ms, and pays
    assert r.allowance_ms >= 0.4 - EPS and len(r.pieces) == 16
    assert all(p.overrun_ms == pytest.approx(0.4) for p in r.pieces[1::2])
    assert r.iteration_times_ms == pytest.approx([3.4] * 8) and r.slowdown == pytest.approx(3.4 / 3)
    strict = simulate(plan, 0.7, piece_ms=0.7, slowdown=1.1, iterations=8)
    assert len(strict.pieces) == 8 and strict.slowdown == 1.0
    assert strict.background_throughput < r.background_throughput < r.background_rate
    starts = sorted(s.start_ms for s in r.foreground if s.gpu == 0 and 0 in s.layers)
    assert len(starts) == 8 and starts[0] == 0.0
    ends = starts[1:] + [r.wall_ms]
    for a, b, t in zip(starts, ends, r.iteration_times_ms):
        assert b - a == pytest.approx(t) and t <= 1.2 * plan.iteration_ms + EPS
    check_schedule(plan, r)


def test_no_idle_time_no_background():
    plan = chain([(4, 0.0, 1.0, 0.2), (4, 0.3, 2.0, 0.0), (4, 0.0, 0.5, 0.5)], gpus=4)
    assert all(not w for w in plan.idle_windows().values())
    for slowdown in (1.0, 1.5, 3.0):
        r = simulate(plan, 2.0, piece_ms=0.1, slowdown=slowdown, iterations=4)
        assert r.pieces == [] and r.background_throughput == 0.0 and r.slowdown == 1.0
        assert r.ratio == pytest.approx(1.0)  # baseline None: the foreground alone
        assert all(u == pytest.approx(1.0) for u in r.utilisation_after.values())


def test_a_gpu_idle_all_iteration_runs_the_background_at_its_full_rate():
    plan = chain([([0], 0.0, 1.5, 0.0), ([0], 0.0, 2.5, 0.0)], gpus=2)  # GPU 1 never used
    for slowdown in (1.0, 1.2):
        r = simulate(plan, 2.0, piece_ms=0.5, slowdown=slowdown, iterations=5, background_batch=8)
        assert {p.gpu for p in r.pieces} == {1}
        assert r.background_rate == pytest.approx(8 / 2.0 * 1e3)
        assert r.background_throughput == pytest.approx(r.background_rate)
        assert r.background_steps == {0: 0, 1: 10}
        assert r.utilisation_before == {0: 1.0, 1: 0.0} and r.utilisation_after[1] == pytest.approx(1.0)


def test_pieces_larger_than_every_window_do_not_run_without_slack():
    plan = demo()  # windows of 2.7 ms (GPU 1) and 6.6 ms (GPUs 2-7)
    r = simulate(plan, 20.0, piece_ms=7.0, slowdown=1.0, iterations=4)
    assert r.piece_size_ms > 6.6 and r.pieces == [] and r.background_throughput == 0
    r = simulate(plan, 20.0, piece_ms=5.0, slowdown=1.0, iterations=4)  # 4 pieces of 5 ms: GPUs 2-7 only
    assert r.pieces and {p.gpu for p in r.pieces} == set(range(2, 8))
    # with switches, a window must hold a piece and the two switches
    r = simulate(plan, 2.6, piece_ms=3.0, slowdown=1.0, iterations=4, switch_ms=0.06)
    assert {p.gpu for p in r.pieces} == set(range(2, 8))
    check_schedule(plan, r, switch_ms=0.06)
    r = simulate(plan, 2.6, piece_ms=3.0, slowdown=1.0, iterations=4, switch_ms=0.04)
    assert {p.gpu for p in r.pieces} == set(range(1, 8))
    check_schedule(plan, r, switch_ms=0.04)


@pytest.mark.parametrize("seed", range(6))
def test_a_looser_bound_never_reduces_background_throughput(seed):
    plan = demo() if seed == 0 else random_plan(seed)
    rng = random.Random(100 + seed)
    step, piece, switch = rng.uniform(0.5, 6.0), rng.uniform(0.2, 1.2), rng.choice([0.0, 0.03])
    last = {"background": -1.0, "total": -1.0}
    for slowdown in (1.0, 1.02, 1.05, 1.1, 1.2, 1.4):
        for objective in last:
            r = simulate(plan, step, piece, slowdown, iterations=4, switch_ms=switch, objective=objective)
            check_schedule(plan, r, switch)
            value = r.background_throughput if objective == "background" else r.total_throughput
            assert value >= last[objective] * (1 - 1e-12), (slowdown, objective)
            last[objective] = value


def test_throughputs_and_ratio():
    plan, dp = demo(), chain([(8, 0.0, 13.57, 0.0)])
    r = simulate(plan, 10.3, piece_ms=0.5, slowdown=1.1, iterations=6, baseline=dp)
    assert r.pieces_per_step == 21 and r.piece_size_ms == pytest.approx(10.3 / 21)
    assert r.background_batch == 4  # default: the foreground's per-GPU batch
    assert r.foreground_throughput == pytest.approx(32 / r.iteration_ms * 1e3)
    assert r.iteration_ms == pytest.approx(r.wall_ms / 6)
    assert r.background_throughput == pytest.approx(len(r.pieces) * 4 / 21 / r.wall_ms * 1e3)
    assert r.total_throughput == pytest.approx(r.foreground_throughput + r.background_throughput)
    assert r.baseline_throughput == pytest.approx(32 / 13.57 * 1e3)
    assert r.ratio == pytest.approx(r.total_throughput / r.baseline_throughput) and r.ratio > 1.2
    assert r.slowdown <= 1.1 + EPS and r.allowance_ms <= 0.1 * plan.iteration_ms + EPS
    for g in range(8):
        assert r.utilisation_after[g] >= r.utilisation_before[g] - EPS
    assert simulate(plan, 10.3, baseline=1000.0).baseline_throughput == 1000.0
    assert "x" in r.summary()


@pytest.mark.parametrize("kwargs, name", [
    (dict(piece_ms=0), "piece_ms"), (dict(piece_ms=-1), "piece_ms"), (dict(slowdown=0.99), "slowdown"),
    (dict(background_piece_ms=-2.0), "background_piece_ms"), (dict(background_piece_ms=0), "background_piece_ms"),
    (dict(switch_ms=-0.1), "switch_ms"), (dict(iterations=0), "iterations"), (dict(iterations=1.5), "iterations"),
    (dict(slowdown=float("nan")), "slowdown"), (dict(background_batch=0), "background_batch"),
    (dict(objective="fast"), "objective"), (dict(baseline=-3.0), "baseline"),
])
def test_bad_input(kwargs, name):
    args = dict(foreground=demo(), background_piece_ms=2.0) | kwargs
    with pytest.raises(BurstError, match=name) as err:
        simulate(**args)
    assert "\n" not in str(err.value)


def test_bad_plans():
    p = demo()
    p.layers[1].compute_ms = -1.0
    with pytest.raises(BurstError, match="layer 1 compute_ms"):
        simulate(p, 2.0)
    p = demo()
    p.layers[2].start_ms = -0.5
    with pytest.raises(BurstError, match="layer 2 start_ms"):
        simulate(p, 2.0)
    p = demo()
    p.iteration_ms = 5.0
    with pytest.raises(BurstError, match="after iteration_ms"):
        simulate(p, 2.0)
    p.iteration_ms = -1.0
    with pytest.raises(BurstError, match="iteration_ms"):
        simulate(p, 2.0)
    with pytest.raises(BurstError, match="foreground"):
        simulate("plan", 2.0)


def test_fill_figure():
    r = simulate(demo(), 10.3, iterations=2)
    fig = fill_figure(r)
    names = [t.name for t in fig.data]
    assert names == ["foreground", "background", "idle"]
    assert len(fig.data[0].x) == len(r.foreground) and len(fig.data[1].x) == len(r.pieces)
    busy = sum(fig.data[0].x) + sum(fig.data[1].x) + sum(fig.data[2].x)
    assert busy == pytest.approx(r.gpus * r.wall_ms)
