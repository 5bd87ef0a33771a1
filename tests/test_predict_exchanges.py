"""The EASGD family's and its descendants' exchanges in the predictor (workbench.netsim.exchanges):
a shaped link's burst spent on each exchange, and the original EASGD's master with socket buffers."""
import pytest

from workbench.netsim.costs import AlphaBeta, CostError, tcp_link
from workbench.netsim.predict import predict
from workbench.netsim.profile import LayerProfile

BW, ALPHA, BURST = 25e6, 50e-6, 64 << 10


def toy(layers: int = 4, params: int = 1 << 16) -> list[LayerProfile]:
    """Equal layers: ``params`` elements (weight + a 64-element bias), 1 ms forward, 2 ms backward."""
    return [LayerProfile(f"l{i}", params, 1e-3, 2e-3, (params - 64, 64)) for i in range(layers)]


def link(burst: float = 0.0, socket_buffer: float = 0.0) -> AlphaBeta:
    return AlphaBeta(BW, ALPHA, "ring", burst=burst, socket_buffer=socket_buffer)


@pytest.mark.parametrize("overlap", [False, True])
def test_sync_easgd_spends_the_burst_on_each_exchange(overlap):
    profile = toy()   # 12 ms of compute, 1 MiB of weights: a 63 ms ring all-reduce at 25 MB/s
    empty = predict(profile, 4, link(), algorithm="sync-easgd", overlap=overlap, update_s=1e-3)
    full = predict(profile, 4, link(BURST), algorithm="sync-easgd", overlap=overlap, update_s=1e-3)
    # the link idles through the update and the compute (13 ms refill 325 kB without overlap), or
    # through the update alone with it (1 ms: 25 kB); the bucket is what that spell refills
    idle = 13e-3 if not overlap else 1e-3
    saved = min(BURST, idle * BW) / BW
    assert empty.step_s - full.step_s == pytest.approx(saved)
    assert full.wire_bytes == empty.wire_bytes and full.compute_s == empty.compute_s
    # every tau steps: the bucket full after tau - 1 local steps, the saving shared by tau steps
    four = predict(profile, 4, link(BURST), algorithm="sync-easgd", overlap=overlap, update_s=1e-3, tau=4)
    plain = predict(profile, 4, link(), algorithm="sync-easgd", overlap=overlap, update_s=1e-3, tau=4)
    assert plain.step_s - four.step_s == pytest.approx(BURST / BW / 4)


def test_a_bucket_deeper_than_the_idle_spell_hides_only_what_the_spell_refills():
    # the steady state: the bucket holds what the link's idle spell refilled, so the exchange is
    # shorter by exactly that spell and the step is the empty-bucket exchange alone
    profile = toy()
    empty = predict(profile, 4, link(), algorithm="sync-easgd", overlap=False)
    deep = predict(profile, 4, link(10e6), algorithm="sync-easgd", overlap=False)
    (message,) = empty.timeline
    assert deep.step_s == pytest.approx(message.end - message.start)


@pytest.mark.parametrize("algorithm,fields", [("local-sgd", {}), ("diloco", {"outer_wire_dtype": "bf16"}),
                                              ("streaming-diloco", {"fragments": 2, "outer_wire_dtype": "bf16"}),
                                              ("streaming-diloco", {"fragments": 4, "sync_delay": 1})])
def test_the_descendants_spend_the_burst_once_per_fragment_exchange(algorithm, fields):
    profile = toy()
    empty = predict(profile, 4, link(), algorithm=algorithm, tau=8, **fields)
    full = predict(profile, 4, link(BURST), algorithm=algorithm, tau=8, **fields)
    fragments = fields.get("fragments", 1)
    # each fragment's exchange starts after at least 2 local steps (24 ms, 600 kB refilled): a
    # full bucket each; an exchange exposed beyond sync_delay steps saves all of it
    exposed_before = empty.exposed_comm_s * 8
    exposed_after = full.exposed_comm_s * 8
    assert exposed_before - exposed_after == pytest.approx(fragments * BURST / BW)
    assert empty.comm_s - full.comm_s == pytest.approx(fragments * BURST / BW / 8)
    assert full.wire_bytes == empty.wire_bytes


def test_the_original_easgd_master_receives_the_next_weights_while_it_replies():
    profile = toy()                  # 1 MiB of weights: 42 ms a direction at 25 MB/s
    model = 4 * sum(l.parameters for l in profile)
    local, p2p = 12e-3, ALPHA + model / BW
    # a transfer that waits for its receiver (the default): a turn at the master is the whole exchange
    half = predict(profile, 5, link(), algorithm="easgd")
    assert half.step_s == pytest.approx(max(4 * 2 * p2p, 2 * p2p + local))
    # socket buffers that hold the next worker's weights: they come in while the master replies, so
    # a round of 4 workers takes 4 transfers, not 8; a worker still waits for both directions
    full = predict(profile, 5, link(socket_buffer=4 << 20), algorithm="easgd")
    assert full.step_s == pytest.approx(4 * p2p) and full.comm_s == pytest.approx(2 * p2p)
    # buffers of a quarter of the weights: the rest comes in after the reply
    part = predict(profile, 5, link(socket_buffer=model / 4), algorithm="easgd")
    assert part.step_s == pytest.approx(4 * (p2p + (p2p - model / 4 / BW)))
    # a worker-bound round (2 workers): each turn ends long before the next arrival
    assert predict(profile, 3, link(socket_buffer=4 << 20), algorithm="easgd").step_s == pytest.approx(2 * p2p + local)


def test_the_original_easgd_spends_the_masters_bucket_only_when_it_idles():
    profile = toy()
    model = 4 * sum(l.parameters for l in profile)
    local, p2p = 12e-3, ALPHA + model / BW
    # worker-bound (2 workers, long local steps): the master idles between turns, both transfers of
    # an exchange go partly at once
    slow = [LayerProfile(l.name, l.parameters, 0.1, 0.2, l.tensor_sizes) for l in profile]
    bound = predict(slow, 3, link(BURST, 4 << 20), algorithm="easgd")
    assert bound.step_s == pytest.approx(2 * p2p - 2 * BURST / BW + 1.2)
    # master-bound (4 workers): the master's downlink port is busy from one arrival to the next,
    # idle only for the (zero) apply, so its bucket stays empty and the round is unchanged
    busy = predict(profile, 5, link(BURST, 4 << 20), algorithm="easgd")
    assert busy.step_s == pytest.approx(4 * p2p)
    # an apply of 1 ms between arrivals refills 25 kB of the master's bucket a turn
    applied = predict(profile, 5, link(BURST, 4 << 20), algorithm="easgd", apply_s=1e-3)
    assert applied.step_s == pytest.approx(4 * (p2p + 1e-3 - 1e-3))
    assert local < 4 * p2p


def test_a_socket_buffer_is_a_size():
    assert tcp_link(200e6, 30e-6, socket_buffer=4 << 20).socket_buffer == 4 << 20
    assert "4.0 MiB socket buffer" in link(socket_buffer=4 << 20).describe()
    with pytest.raises(CostError, match=r"socket_buffer must be a number >= 0 \(bytes a connection carries"):
        AlphaBeta(BW, ALPHA, socket_buffer=-1)


def test_cli_predicts_easgd_with_a_socket_buffer(tmp_path, capsys):
    import json

    from workbench.cli import main
    profile = tmp_path / "p.csv"   # lenet-sized weights, 9 ms a step
    profile.write_text("name,parameters,forward_s,backward_s\nl,61706,0.003,0.006\n")
    common = ["predict", "--profile", str(profile), "--algorithm", "easgd", "--ranks", "5", "--bandwidth", "2.5e7",
              "--latency", "1e-4"]
    assert main([*common, "--json", str(tmp_path / "plain.json")]) == 0
    assert main([*common, "--socket-buffer", "4M", "--json", str(tmp_path / "buffered.json")]) == 0
    assert "4.0 MiB socket buffer" in capsys.readouterr().out
    plain, buffered = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("plain", "buffered"))
    assert buffered["network"]["socket_buffer_bytes"] == 4 << 20 and plain["network"]["socket_buffer_bytes"] == 0
    p2p = 1e-4 + 61706 * 4 / 2.5e7   # four workers a round: 8 transfers at the master, or 4
    assert plain["rows"][0]["step_s"] == pytest.approx(8 * p2p)
    assert buffered["rows"][0]["step_s"] == pytest.approx(4 * p2p)


def test_the_steady_bucket_is_a_fixed_point_where_the_plain_iteration_flips():
    # a small model on a fast link, 2 workers: a full bucket sends the weights at once, the round
    # shortens, the master's links idle too little to refill, the next round is long, and so on; the
    # steady state is the bucket level that the idle spells of its own round refill
    profile = [LayerProfile("l", 50890, 2e-4, 4e-4, (50890,))]   # mlp's 204 kB, 0.6 ms a step
    model, apply_s = 50890 * 4, 1e-4
    for buffered in (0, 36 << 20):
        net = tcp_link(1e9, 100e-6, burst_bytes=250_000, socket_buffer=buffered)
        p = predict(profile, 3, net, algorithm="easgd", apply_s=apply_s, update_s=1e-4)
        up = (p.comm_s - apply_s) / 2   # both transfers alike: the master's two links idle alike
        tokens = min(net.burst, (p.step_s / 2 - up) * net.bandwidth)   # a turn every round / 2
        assert up == pytest.approx(net.latency + (model - tokens) / net.bandwidth, rel=1e-9), buffered
        empty = predict(profile, 3, tcp_link(1e9, 100e-6, socket_buffer=buffered), algorithm="easgd",
                        apply_s=apply_s, update_s=1e-4)
        assert p.step_s < empty.step_s
