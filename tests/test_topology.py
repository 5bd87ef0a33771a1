"""Topologies, MultiTree, 2D ring and the simulator: counts, validity, published step counts,
closed forms, speed, bad input, and MultiTree executed over real MPI."""
from __future__ import annotations

import math

import pytest

from workbench.collectives import ScheduleError, schedules, topology
from workbench.collectives.multitree import multitree_trees
from workbench.collectives.simulator import simulate
from workbench.runtime.launcher import run_mpi

ALPHA, B, S = 150e-9, 16e9, 64 << 20


@pytest.mark.parametrize("build, nodes, links", [
    (lambda: topology.ring(8), 8, 16),
    (lambda: topology.fully_connected(5), 5, 20),
    (lambda: topology.torus(4, 4), 16, 64),
    (lambda: topology.torus(8, 8), 64, 256),
    (lambda: topology.torus(2, 3, 4), 24, 24 * 2 * 3 - 24 * 2 // 2),  # size-2 axis: one link, not two
    (lambda: topology.mesh(4, 4), 16, 48),
    (lambda: topology.mesh(8, 8), 64, 224),
    (lambda: topology.fat_tree(64, nodes_per_leaf=8), 64, 2 * (64 + 8 * 8)),
    (lambda: topology.bigraph(32, switches_per_layer=4), 32, 2 * (32 + 16)),
])
def test_link_counts(build, nodes, links):
    topo = build()
    assert topo.nodes == nodes and len(topo.links) == links
    assert all((v, u) in topo.links for u, v in topo.links)  # every cable both ways


def test_neighbours_and_routes():
    t = topology.torus(4, 4)
    assert sorted(t.neighbors(0)) == [1, 3, 4, 12] and sorted(t.neighbors(5)) == [1, 4, 6, 9]
    m = topology.mesh(4, 4)
    assert sorted(m.neighbors(0)) == [1, 4] and sorted(m.neighbors(5)) == [1, 4, 6, 9]
    assert t.route(0, 10) == ((0, 4), (4, 8), (8, 9), (9, 10))  # rows first, then columns
    assert t.route(0, 12) == ((0, 12),)                          # the wrap-around link
    assert len(m.route(0, 15)) == 6
    f = topology.fat_tree(64, nodes_per_leaf=8)
    assert len(f.route(0, 1)) == 2 and len(f.route(0, 63)) == 4  # same leaf; up and down
    g = topology.bigraph(32, switches_per_layer=4)
    assert len(g.route(0, 31)) == 3 and len(g.route(0, 5)) == 4  # across layers; same layer
    for topo in (t, m, f, g):
        for src, dst in [(0, topo.nodes - 1), (3, 2)]:
            route = topo.route(src, dst)
            assert route[0][0] == src and route[-1][1] == dst and all(link in topo.links for link in route)


@pytest.mark.parametrize("topo", [topology.torus(4, 4), topology.torus(3, 5), topology.mesh(4, 4),
                                  topology.mesh(2, 6), topology.ring(7)])
def test_ring_order_is_a_hamiltonian_cycle(topo):
    order = topo.ring_order()
    assert sorted(order) == list(range(topo.nodes))
    assert all((a, b) in topo.links for a, b in zip(order, order[1:] + order[:1]))


@pytest.mark.parametrize("dims, published", [((4, 4), {2: 7, 3: 6, 5: 5}), ((8, 8), {2: 18, 3: 17, 5: 17})])
def test_multitree_matches_the_published_step_counts(dims, published):
    topo = topology.torus(*dims)
    for k, steps in published.items():
        schedule = schedules.multitree(topo, k)
        schedule.validate()
        assert schedule.params["tree_steps"] <= steps + 1 and schedule.num_steps == 2 * schedule.params["tree_steps"]
        bound = topology.lower_bound_steps(topo.nodes, len(topo.links))
        assert schedule.params["tree_steps"] >= bound


@pytest.mark.parametrize("topo", [topology.torus(4, 4), topology.torus(3, 5), topology.mesh(4, 4),
                                  topology.mesh(3, 3), topology.ring(6), topology.fully_connected(5),
                                  topology.torus(2, 2, 2)])
def test_multitree_is_one_hop_and_never_reuses_a_link_in_a_step(topo):
    for k in (2, 3):
        schedule = schedules.multitree(topo, k)
        schedule.validate()
        for step in schedule.steps:
            links = [(t.src, t.dst) for t in step]
            assert all(link in topo.links for link in links)   # one hop
            assert len(links) == len(set(links))               # contention-free
        edges, T = multitree_trees(topo, k)
        assert len(edges) == topo.nodes * (topo.nodes - 1)     # N trees of N-1 edges


@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 4), (2, 2), (2, 3), (4, 4), (3, 5)])
def test_ring_2d_validates(rows, cols):
    s = schedules.ring_2d(rows, cols).validate()
    assert s.num_steps == 2 * (cols - 1) + 2 * (rows - 1)


def test_closed_forms_without_contention():
    n = 16
    ring_topo = topology.ring(n)
    assert simulate(schedules.ring(n), ring_topo, S).seconds == pytest.approx(2 * (n - 1) * (ALPHA + S / (n * B)))
    full = topology.fully_connected(n)
    assert simulate(schedules.recursive_doubling(n), full, S).seconds == pytest.approx(math.log2(n) * (ALPHA + S / B))
    hd = sum(2 * (ALPHA + S / (2 ** k * B)) for k in range(1, int(math.log2(n)) + 1))
    assert simulate(schedules.halving_doubling(n), full, S).seconds == pytest.approx(hd)
    torus = topology.torus(4, 4)
    mt = schedules.multitree(torus, 2)
    result = simulate(mt, torus, S)
    assert result.max_link_flows == 1
    assert result.seconds == pytest.approx(mt.num_steps * (ALPHA + S / (n * B)))
    assert simulate(schedules.ring(n, order=torus.ring_order()), torus, S).seconds / result.seconds == \
        pytest.approx(2 * (n - 1) / mt.num_steps, rel=1e-3)


def test_contention_shares_a_link():
    # a ring in rank order on a 4x4 torus: rank 3 -> 4 crosses two hops, rows share links
    torus = topology.torus(4, 4)
    naive = simulate(schedules.ring(16), torus, S)
    embedded = simulate(schedules.ring(16, order=torus.ring_order()), torus, S)
    assert naive.seconds > embedded.seconds and embedded.max_link_flows == 1
    util = embedded.link_utilisation()
    assert 0 < max(util.values()) <= 1


def test_bad_input_is_a_clear_error():
    with pytest.raises(ScheduleError, match="k must be an integer >= 2"):
        schedules.multitree(topology.torus(2, 2), k=1)
    with pytest.raises(ScheduleError, match="do not connect every node"):
        topology.Topology("broken", 3, {(0, 1), (1, 0)})
    with pytest.raises(ScheduleError, match="has 16 ranks but the torus has only 4 nodes"):
        simulate(schedules.ring(16), topology.torus(2, 2), 1024)
    with pytest.raises(ScheduleError, match="nodes .* must be a multiple"):
        topology.fat_tree(10, nodes_per_leaf=4)
    with pytest.raises(ScheduleError, match="switch-aware construction is not implemented"):
        schedules.multitree(topology.fat_tree(16, nodes_per_leaf=4))


@pytest.mark.mpi
@pytest.mark.parametrize("rows, cols", [(2, 2), (2, 3)])
def test_multitree_and_ring_2d_run_over_mpi(rows, cols):
    result = run_mpi(rows * cols, ["tests/mpi/topology_schedules.py", str(rows), str(cols)], timeout=240)
    assert f"ok 4 schedules on a {rows}x{cols} grid" in result.output
