"""The virtual cluster on paper (workbench.vcluster.plan, pure): names, addresses, routes, rates and
the one-line errors, before any namespace exists; and the ``switch`` network it shares with the
simulator."""
from __future__ import annotations

import ipaddress

import pytest

from workbench.network import parse
from workbench.netsim.simulator import simulate
from workbench.schedules import SCHEDULES
from workbench.vcluster.plan import MAX_NODES, RANGE, Cable, Plan, PlanError, format_rate, parse_latency, parse_rate


@pytest.mark.parametrize("text, bits", [("100mbit", 10**8), ("1gbit", 10**9), ("25gbit", 25 * 10**9),
                                         ("500kbit", 5 * 10**5), ("2.5gbit", 2_500_000_000), ("1000000", 10**6)])
def test_rates_are_tcs_units(text, bits):
    assert parse_rate(text) == bits
    assert parse_rate(format_rate(bits)) == bits


@pytest.mark.parametrize("text", ["fast", "1gbyte", "-5mbit", "0", "100tbit", ""])
def test_a_bad_rate_is_one_line_naming_the_option(text):
    with pytest.raises(PlanError) as info:
        parse_rate(text)
    assert str(info.value).startswith("bandwidth: ") and "\n" not in str(info.value) and "100mbit" in str(info.value)


def test_queue_sizes():
    assert Plan("vc", 2, queue="1M").queue == 1 << 20 and Plan("vc", 2, queue=131072).queue == 131072
    from workbench.vcluster.wiring import queue_bytes
    assert queue_bytes(Plan("vc", 2, bandwidth="100mbit")) == 128 << 10  # the floor
    assert queue_bytes(Plan("vc", 2, bandwidth="10gbit")) == 10**10 // 8 * 5 // 1000  # 5 ms at the rate
    with pytest.raises(PlanError, match="^queue: "):
        Plan("vc", 2, queue="huge")


def test_latency_units():
    assert parse_latency("50us") == pytest.approx(50e-6) and parse_latency("1ms") == pytest.approx(1e-3)
    with pytest.raises(PlanError, match="^latency: "):
        parse_latency("soon")


@pytest.mark.parametrize("kwargs, start", [
    (dict(name="Vc", nodes=2), "name: "), (dict(name="toolongname", nodes=2), "name: "),
    (dict(name="vc", nodes=0), "nodes: "), (dict(name="vc", nodes=MAX_NODES + 1), "nodes: "),
    (dict(name="vc", nodes=4, topology="torus:2x3"), "topology: "), (dict(name="vc", nodes=4, topology="torus"), "topology: "),
    (dict(name="vc", nodes=8, topology="fat_tree:8x4"), "topology: "), (dict(name="vc", nodes=2, bandwidth="x"), "bandwidth: "),
])
def test_bad_plans_are_one_line_errors_naming_the_option(kwargs, start):
    with pytest.raises(PlanError) as info:
        Plan(**kwargs)
    assert str(info.value).startswith(start) and "\n" not in str(info.value)


def test_names_fit_linux_interface_names_and_carry_the_prefix_and_cluster_name():
    p = Plan("abcdefgh", MAX_NODES, "switch")
    names = [p.bridge, p.launcher_end] + [p.host_end(i) for i in range(p.nodes)]
    assert all(len(n) <= 15 and n.startswith("wbvabcdefgh") for n in names)
    assert all(n.startswith("wbv-abcdefgh-") for n in [p.launcher_netns, *(p.netns(i) for i in range(p.nodes))])
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("slot", [0, 1, 255, 256, 511])
def test_addresses_stay_in_the_benchmarking_range(slot):
    p = Plan("vc", MAX_NODES, "switch", slot=slot)
    every = [p.head_address, p.launcher_address] + [p.address(i) for i in range(p.nodes)]
    assert all(ipaddress.ip_address(a) in RANGE for a in every)
    assert all(ipaddress.ip_address(a) in p.subnet for a in every) and len(set(every)) == len(every)
    assert p.node_of(p.address(7)) == 7 and p.node_of(p.hostname(7)) == 7 and p.node_of("elsewhere") is None


@pytest.mark.parametrize("spec, nodes", [("ring", 5), ("torus:3x3", 9), ("torus:2x4", 8), ("mesh:2x3", 6),
                                         ("mesh:4x4", 16), ("fully_connected", 4)])
def test_hop_by_hop_routes_follow_the_topologys_routes(spec, nodes):
    """Each node forwards by its own table: following next hops from any node to any other must walk
    exactly the route the simulator charges for, over cables that exist."""
    p = Plan("vc", nodes, spec)
    topo = p.topo
    cables = set(p.cables)
    tables = {i: {r.dst: r for r in p.routes(i)} for i in range(nodes)}
    for src in range(nodes):
        for dst in range(nodes):
            if src == dst:
                continue
            here, hops = src, []
            while here != dst:
                route = tables[here][p.address(dst)]
                nxt = p.node_of(route.via)
                assert Cable(min(here, nxt), max(here, nxt)) in cables
                assert route.device == Cable(min(here, nxt), max(here, nxt)).device(here)
                hops.append((here, nxt))
                here = nxt
            assert tuple(hops) == topo.route(src, dst), (spec, src, dst)


def test_switch_shapes_both_ends_of_every_port_and_direct_networks_both_ends_of_every_cable():
    s = Plan("vc", 4, "switch")
    assert s.cables == [] and s.routes(0) == []
    assert sorted(d for n, d in s.shaped_links() if n is None) == [s.host_end(i) for i in range(4)]
    t = Plan("vc", 4, "torus:2x2")
    assert len(t.shaped_links()) == 2 * len(t.cables) == 2 * len({frozenset(link) for link in t.topo.links})


def test_a_plan_reads_back_from_its_record():
    p = Plan("vc", 6, "mesh:2x3", "200mbit", 50e-6, True, slot=3, shared="/x")
    assert Plan.from_dict(p.to_dict()) == p


def test_switch_topology_in_the_simulator_costs_a_ring_at_the_port_rate():
    """The simulator's model of the virtual cluster's switch: the ring all-reduce crosses each node's
    port at the link rate, so it takes 2(n-1)/n * S / B (plus latency), the bandwidth bound."""
    topo = parse("switch:4")
    assert topo.kind == "switch" and topo.nodes == 4 and topo.switches == 1
    assert topo.route(0, 3) == ((0, 4), (4, 3))
    size, bandwidth = 8 << 20, 12.5e6
    result = simulate(SCHEDULES["ring"](4), topo, size, link_bandwidth=bandwidth, link_latency=0.0)
    assert result.seconds == pytest.approx(2 * 3 / 4 * size / bandwidth, rel=1e-6)
