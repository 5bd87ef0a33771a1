"""The scale-out predictor (GradientFlow's question): closed forms against the simulator, the
iteration model's invariants, AlexNet's scaling shape, the EASGD shares and `workbench predict`."""
from __future__ import annotations

import json

import pytest

from workbench import schedules
from workbench.cli import main
from workbench.comm.buckets import bucket_bounds
from workbench.netsim.costs import CLOSED_FORMS, AlphaBeta, CostError, Simulated, closed_form_seconds, wire_bytes
from workbench.netsim.predict import (COLUMNS, PredictError, communication, compare, easgd_shares, predict,
                                      scaling)
from workbench.netsim.profile import (LayerProfile, ProfileError, alexnet_profile, layer_flops, profile_from_table,
                                      profile_table)
from workbench.netsim.simulator import simulate
from workbench.network import topology

#: GradientFlow's full stack as predicted here: Horovod's 64 MB fusion, overlap, fp16, CSC 1%
FULL_STACK = dict(fusion_bytes=64 << 20, overlap=True, wire_dtype="fp16", sparse_ratio=0.01)
DENSE = dict(fusion_bytes=0)   # dense fp32, one all-reduce per tensor, after backward


def toy(layers: int = 4, params: int = 1 << 16) -> list[LayerProfile]:
    """Equal layers: ``params`` elements (weight + a 64-element bias), 1 ms forward, 2 ms backward."""
    return [LayerProfile(f"l{i}", params, 1e-3, 2e-3, (params - 64, 64)) for i in range(layers)]


@pytest.mark.parametrize("collective", CLOSED_FORMS)
def test_closed_forms_equal_the_simulator_at_small_n(collective):
    for n in range(1, 10):
        topo = topology.fully_connected(n)
        for nbytes in (4, 4096, 3 << 20):
            simulated = simulate(schedules.SCHEDULES[collective](n), topo, nbytes, 7e9, 5e-6).seconds
            assert closed_form_seconds(collective, n, nbytes, 7e9, 5e-6) == pytest.approx(simulated, rel=1e-9, abs=1e-15)


def test_wire_bytes_are_what_the_schedules_send():
    for collective in schedules.SCHEDULES:
        for n in (1, 2, 3, 5, 8):
            s = schedules.SCHEDULES[collective](n)
            sent = sum(len(step) for step in s.steps) * (1 << 20) / s.nchunks / n
            assert wire_bytes(collective, n, 1 << 20) == pytest.approx(sent), (collective, n)


def test_the_simulated_network_predicts_what_the_closed_form_does():
    profile = toy()
    for options in (DENSE, FULL_STACK):
        exact = predict(profile, 6, AlphaBeta(), **options)
        simulated = predict(profile, 6, Simulated(), **options)
        assert simulated.step_s == pytest.approx(exact.step_s, rel=1e-9)
        assert simulated.wire_bytes == pytest.approx(exact.wire_bytes)


def test_one_rank_has_no_communication():
    for options in (DENSE, FULL_STACK, {}):
        p = predict(alexnet_profile(), 1, **options)
        assert (p.comm_s, p.exposed_comm_s, p.comm_share, p.wire_bytes, p.messages) == (0, 0, 0, 0, 0)
        assert p.step_s == p.compute_s and p.speedup == 1.0 and p.efficiency == 1.0


def test_more_fusion_never_adds_messages():
    thresholds = [0, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 1 << 30, None]
    for profile in (toy(), alexnet_profile()):
        for extra in ({}, {"wire_dtype": "fp16"}, {"sparse_ratio": 0.01}):
            counts = [predict(profile, 16, fusion_bytes=f, **extra).messages for f in thresholds]
            assert counts == sorted(counts, reverse=True), (extra, counts)


def test_overlap_never_makes_a_step_longer():
    for profile in (toy(), alexnet_profile()):
        for n in (2, 16, 512):
            for fusion in (0, 1 << 20, 64 << 20, None):
                for extra in ({}, {"wire_dtype": "fp16", "sparse_ratio": 0.05}):
                    off = predict(profile, n, fusion_bytes=fusion, overlap=False, **extra)
                    on = predict(profile, n, fusion_bytes=fusion, overlap=True, **extra)
                    assert on.step_s <= off.step_s + 1e-15 and on.wire_bytes == off.wire_bytes


def test_the_timeline_keeps_one_message_at_a_time_after_its_gradients():
    profile = alexnet_profile()
    p = predict(profile, 64, fusion_bytes=1 << 20, overlap=True, wire_dtype="fp16", sparse_ratio=0.1)
    forward = sum(l.forward_s for l in profile)
    for before, after in zip(p.timeline, p.timeline[1:]):
        assert after.start >= before.end - 1e-15
    assert p.timeline[0].start > forward            # the first bucket waits for fc8's backward
    assert p.timeline[-1].what == "decision"
    assert [m.what for m in p.timeline[:2]] == ["norms", "chunks"]


def test_fp16_halves_the_payload_exactly_plus_the_decision():
    for n in (2, 3, 16, 512):
        for fusion in (None, 0, 1 << 20):
            fp32 = predict(alexnet_profile(), n, fusion_bytes=fusion)
            for dtype in ("fp16", "bf16"):
                half = predict(alexnet_profile(), n, fusion_bytes=fusion, wire_dtype=dtype)
                decision = round(2 * (n - 1) / n * 4)   # one float, counted as MPI's native all-reduce
                assert half.wire_bytes == pytest.approx(fp32.wire_bytes / 2 + decision, rel=1e-12)
                assert half.messages == fp32.messages + 1


def test_csc_sends_norms_then_the_selected_chunks():
    """CSC's traffic formula (docs/papers.md, "3. GradientFlow"), exact when rho K is whole:
    2(N-1)/N (rho P b + 4 K)."""
    c, chunks, rho = 64, 256, 0.25
    P = c * chunks
    profile = [LayerProfile("only", P, 1e-3, 2e-3)]
    for n in (2, 8, 100):
        for dtype, b in (("fp32", 4), ("fp16", 2)):
            p = predict(profile, n, sparse_ratio=rho, sparse_chunk=c, wire_dtype=dtype)
            decision = 0 if dtype == "fp32" else round(2 * (n - 1) / n * 4)
            assert p.wire_bytes == pytest.approx(2 * (n - 1) / n * (rho * P * b + 4 * chunks) + decision)
            assert p.messages == 2 + (dtype != "fp32")
    # ratio 1 (or one chunk): dense, no norms
    dense = predict(profile, 8, sparse_ratio=1.0, sparse_chunk=c)
    assert dense.messages == 1 and dense.wire_bytes == pytest.approx(2 * 7 / 8 * 4 * P)


def test_buckets_are_the_runtimes():
    profile = alexnet_profile()
    sizes = [t for layer in profile for t in layer.tensor_sizes]
    assert len(sizes) == 16
    assert predict(profile, 4, fusion_bytes=0).buckets == 16 == predict(profile, 4, fusion_bytes=0).messages
    assert predict(profile, 4).buckets == 1
    bounds, offset = [], 0
    for size in sizes:
        bounds.append((offset, offset + size))
        offset += size
    cut = bucket_bounds(bounds, 64 << 20)
    assert [b[2] for b in cut] == [(15, 14, 13, 12), (11, 10), tuple(range(9, -1, -1))]
    assert predict(profile, 4, fusion_bytes=64 << 20).buckets == 3


def test_alexnet_profile_is_torchvisions():
    profile = alexnet_profile()
    assert [l.name for l in profile] == ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"]
    assert sum(l.parameters for l in profile) == 61_100_840
    assert profile[5].tensors == (9216 * 4096, 4096)
    macs = sum(flops for _, _, flops in layer_flops()) / 2
    assert macs == pytest.approx(714e6, rel=0.01)           # torchvision's 0.71 GFLOPS (multiply-adds)
    images_per_s = 128 / sum(l.forward_s + l.backward_s for l in profile)
    assert images_per_s == pytest.approx(3.3e3, rel=0.05)   # GradientFlow's implied single-GPU rate
    slow = alexnet_profile(gpu_flops=11.76e12, efficiency=0.5, batch=64)
    assert slow[0].forward_s == pytest.approx(profile[0].forward_s * (64 / 128) * (125e12 * 0.11) / (11.76e12 * 0.5))


def test_alexnet_scaling_shape():
    """Dense per-tensor fp32 is far below linear at 64 ranks; the full stack scales to 512."""
    profile = alexnet_profile()
    ranks = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    table = compare(profile, ranks, {"dense per-tensor fp32": DENSE, "full stack": FULL_STACK})
    print("\n" + table.to_string(float_format=lambda v: f"{v:.3f}"))
    dense = table["dense per-tensor fp32"]
    full = table["full stack"]
    assert dense.loc[64, "speedup"] < 64 / 2                 # less than half of linear
    assert full.loc[512, "efficiency"] > 0.6
    assert (full["speedup"] >= dense["speedup"]).all()
    assert full.loc[512, "speedup"] > 5 * dense.loc[64, "speedup"]


def test_scaling_table_and_errors():
    frame = scaling(toy(), [1, 2, 4], fusion_bytes=0)
    assert list(frame.columns) == list(COLUMNS) and frame["ranks"].tolist() == [1, 2, 4]
    assert frame["efficiency"].tolist() == pytest.approx((frame["speedup"] / frame["ranks"]).tolist())
    with pytest.raises(PredictError, match="ranks must be an integer >= 1; got 0"):
        predict(toy(), 0)
    with pytest.raises(PredictError, match="algorithm must be one of sync-sgd, easgd, sync-easgd"):
        predict(toy(), 2, algorithm="adam")
    with pytest.raises(PredictError, match="sync-easgd exchanges weights"):
        predict(toy(), 2, algorithm="sync-easgd", wire_dtype="fp16")
    with pytest.raises(PredictError, match="ranks must be >= 2 for easgd"):
        predict(toy(), 1, algorithm="easgd")
    with pytest.raises(ValueError, match="sparse_ratio must be a number in"):
        predict(toy(), 2, sparse_ratio=2)
    with pytest.raises(CostError, match="collective must be one of ring"):
        predict(toy(), 2, collective="double_binary_tree")   # no closed form: use Simulated
    assert predict(toy(), 4, Simulated(), collective="double_binary_tree").step_s > 0
    assert communication("gradientflow", fusion_bytes=0).fusion_bytes == 0


def test_easgd_shares_round_robin_against_sync():
    """The SC'17 claim's direction: the round-robin master's share is large and grows with the
    ranks; Sync EASGD's all-reduce, overlapped with the gradient, is much smaller."""
    frame = easgd_shares(alexnet_profile(), (4, 16))
    print("\n" + frame.to_string(float_format=lambda v: f"{v:.3f}"))
    share = frame.set_index(["algorithm", "overlap", "ranks"])["comm_share"]
    for n in (4, 16):
        assert share[("easgd", False, n)] > share[("sync-easgd", False, n)] > share[("sync-easgd", True, n)]
    assert share[("easgd", False, 16)] > share[("easgd", False, 4)] > 0.5
    # the round-robin formula itself: N-1 exchanges of 2 (alpha + M/B) per round
    profile, net = toy(), AlphaBeta(1e9, 1e-5)
    local = sum(l.forward_s + l.backward_s for l in profile)
    exchange = 2 * (1e-5 + sum(l.parameters for l in profile) * 4 / 1e9)
    for n, tau in ((2, 1), (8, 1), (8, 4)):
        p = predict(profile, n, net, algorithm="easgd", tau=tau)
        assert p.step_s == pytest.approx(max((n - 1) * exchange, exchange + tau * local) / tau)
    # Sync EASGD with tau: the exchange every tau steps
    one, four = (predict(alexnet_profile(), 16, algorithm="sync-easgd", overlap=True, tau=t) for t in (1, 4))
    assert four.wire_bytes == pytest.approx(one.wire_bytes / 4) and four.comm_share < one.comm_share


def test_profiles_from_tables(tmp_path):
    table = profile_table(alexnet_profile())
    path = tmp_path / "alexnet.csv"
    table.to_csv(path, index=False)
    again = profile_from_table(path)
    assert [(l.name, l.parameters, l.tensors) for l in again] == [(l.name, l.parameters, l.tensors)
                                                                  for l in alexnet_profile()]
    rows = [{"name": "a", "parameters": 10, "forward_s": 0.1, "backward_s": 0.2}]
    assert profile_from_table(rows)[0].tensor_sizes == (10,)
    with pytest.raises(ProfileError, match=r"lacks the column\(s\) \['backward_s'\]"):
        profile_from_table([{"name": "a", "parameters": 1, "forward_s": 0.1}])
    with pytest.raises(ProfileError, match="must be positive sizes adding up to parameters=10"):
        LayerProfile("a", 10, 0.1, 0.2, (3, 3))
    with pytest.raises(ProfileError, match="no file at"):
        profile_from_table(tmp_path / "missing.csv")


def test_cli_writes_the_documented_json(tmp_path, capsys):
    from workbench.cli.predict import JSON_KEYS
    out = tmp_path / "sub" / "predict.json"
    code = main(["predict", "--model", "alexnet", "--ranks", "1,64,512", "--fusion-bytes", "64M", "--overlap",
                 "--wire-dtype", "fp16", "--sparse-ratio", "0.01", "--json", str(out)])
    assert code == 0
    assert "efficiency" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert tuple(report) == JSON_KEYS
    assert [r["ranks"] for r in report["rows"]] == [1, 64, 512]
    assert set(report["rows"][0]) == set(COLUMNS)
    expected = predict(alexnet_profile(), 512, **FULL_STACK)
    assert report["rows"][2]["step_s"] == pytest.approx(expected.step_s)
    assert report["network"] == {"model": "closed form", "collective": "ring", "bandwidth_Bps": 7e9, "latency_s": 5e-6,
                                 "burst_bytes": 0, "socket_buffer_bytes": 0}
    assert report["options"]["sparse_ratio"] == 0.01 and report["profile"]["parameters"] == 61_100_840


@pytest.mark.parametrize("argv,message", [
    (["--ranks", "0"], "argument --ranks: must be a comma-separated list of integers >= 1"),
    (["--ranks", "1,x"], "argument --ranks: must be a comma-separated list of integers >= 1"),
    (["--fusion-bytes", "lots"], "argument --fusion-bytes: must be 0 (one message per tensor)"),
    (["--wire-dtype", "fp8"], "argument --wire-dtype: invalid choice: 'fp8'"),
    (["--burst", "-1"], "argument --burst: '-1' is not a size"),
    (["--socket-buffer", "lots"], "argument --socket-buffer: 'lots' is not a size"),
])
def test_cli_refuses_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and len([line for line in err if "error" in line]) == 1


@pytest.mark.parametrize("argv,message", [
    (["--tau", "0"], "tau must be an integer >= 1"),
    (["--sparse-ratio", "1.5"], "sparse_ratio must be a number in (0, 1]"),
    (["--batch", "0"], "batch must be an integer >= 1"),
    (["--collective", "double_binary_tree"], "collective must be one of ring"),
    (["--burst", "64K", "--simulate"], "--burst is the closed form's"),
    (["--socket-buffer", "4M", "--simulate"], "--socket-buffer is the closed form's"),
])
def test_cli_refuses_bad_values_in_one_line(argv, message, capsys):
    assert main(["predict", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("workbench predict: error: ") and message in err


def _bus_measurements(nranks: int = 4, latency: float = 3e-5, bandwidth: float = 2e9) -> dict:
    """A bench file whose all-reduces took exactly what ``bus(nranks)`` with these links gives."""
    rows = [{"algorithm": a, "bytes": b,
             "median_s": simulate(schedules.SCHEDULES[a](nranks), topology.bus(nranks), b, bandwidth, latency).seconds}
            for a in ("ring", "recursive_doubling") for b in (4096, 1 << 20, 8 << 20)]
    return {"ranks": nranks, "results": rows}


def test_a_calibration_predicts_on_the_network_it_was_fitted_on():
    from workbench.netsim.calibration import calibrate
    from workbench.netsim.costs import from_calibration, network_model
    cal = calibrate(_bus_measurements(), topology.bus(4))
    assert cal.link_bandwidth == pytest.approx(2e9, rel=1e-6) and cal.link_latency == pytest.approx(3e-5, rel=1e-6)
    model = from_calibration(cal, "ring")
    assert isinstance(model, Simulated) and network_model(cal).describe() == model.describe()
    # the fitted measurement itself comes back, and 8 ranks share the bus the same way
    for n in (4, 8):
        on_bus = simulate(schedules.ring(n), topology.bus(n), 8 << 20, 2e9, 3e-5).seconds
        assert model.allreduce(8 << 20, n) == pytest.approx(on_bus, rel=1e-6)
    # the closed form for own links is several times faster: the defect this guards against
    assert model.allreduce(8 << 20, 4) > 3 * closed_form_seconds("ring", 4, 8 << 20, 2e9, 3e-5)
    with pytest.raises(CostError, match="fitted on 'bus', not fully_connected"):
        AlphaBeta.from_calibration(cal)
    own = calibrate(_bus_measurements())   # default fully_connected: the closed form
    assert isinstance(from_calibration(own), AlphaBeta)
    with pytest.raises(CostError, match="fitted on 'torus'"):
        from_calibration(calibrate(_bus_measurements(), topology.torus(2, 2)))


def test_cli_predicts_with_the_calibrations_network(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_bus_measurements()))
    profile = tmp_path / "toy.csv"
    profile_table(toy()).to_csv(profile, index=False)
    out = tmp_path / "p.json"
    assert main(["predict", "--profile", str(profile), "--calibration", str(bench), "--ranks", "4",
                 "--json", str(out)]) == 0
    assert "simulated (lockstep) on bus:{n}" in capsys.readouterr().out
    row = json.loads(out.read_text())["rows"][0]
    comm = simulate(schedules.ring(4), topology.bus(4), 4 * 4 * (1 << 16), 2e9, 3e-5).seconds
    assert row["step_s"] == pytest.approx(4 * 3e-3 + comm, rel=1e-6)


def test_cli_takes_the_network_the_calibration_ran_on(tmp_path, capsys):
    """4 nodes on a switch (a virtual cluster): every rank its own port, fitted on fully_connected:4 and
    predicted in closed form with the fitted links; without a calibration the flag is refused."""
    bench = tmp_path / "bench.json"
    rows = [{"algorithm": "ring", "bytes": b,
             "median_s": closed_form_seconds("ring", 4, b, 6e6, 2e-4)} for b in (1 << 18, 1 << 20, 1 << 24)]
    bench.write_text(json.dumps({"ranks": 4, "results": rows}))
    out = tmp_path / "p.json"
    assert main(["predict", "--calibration", str(bench), "--calibration-topology", "fully_connected:4",
                 "--ranks", "64", "--fusion-bytes", "0", "--json", str(out)]) == 0
    network = json.loads(out.read_text())["network"]
    assert "ring, closed form" in capsys.readouterr().out
    assert network["bandwidth_Bps"] == pytest.approx(6e6, rel=1e-6) and network["latency_s"] == pytest.approx(2e-4, rel=1e-6)
    assert main(["predict", "--calibration-topology", "fully_connected:4"]) == 2
    assert capsys.readouterr().err.startswith("workbench predict: error: --calibration-topology describes")


def test_a_straggler_delays_lock_step_messages_and_the_step():
    profile = toy()                      # 4 ms forward, 8 ms backward
    plain = predict(profile, 4, fusion_bytes=None)
    late = predict(profile, 4, fusion_bytes=None, skew_s=3e-3)
    # no overlap: the one message starts after the slowest backward, 3 ms later
    assert late.step_s == pytest.approx(plain.step_s + 3e-3)
    assert late.compute_s == plain.compute_s and late.exposed_comm_s == pytest.approx(plain.exposed_comm_s + 3e-3)
    overlapped = predict(profile, 4, fusion_bytes=0, overlap=True, skew_s=3e-3)
    first = overlapped.timeline[0]
    assert first.start == pytest.approx((4e-3 + 2e-3) * 1.25)   # the last layer's gradients, 12 / 12 ms later
    assert overlapped.step_s >= 1.25 * 12e-3
    assert predict(profile, 1, skew_s=3e-3).step_s == pytest.approx(12e-3)   # nobody to wait for
    easgd = predict(profile, 4, algorithm="sync-easgd", overlap=False, skew_s=3e-3)
    assert easgd.step_s == pytest.approx(predict(profile, 4, algorithm="sync-easgd", overlap=False).step_s + 3e-3)
    with pytest.raises(PredictError, match="skew_s must be a number of seconds >= 0"):
        predict(profile, 4, skew_s=-1.0)
    with pytest.raises(PredictError, match="skew_s applies to lock-step algorithms"):
        predict(profile, 4, algorithm="easgd", skew_s=1e-3)


def test_a_links_burst_sends_a_steps_first_bytes_at_once():
    # a shaped link's token bucket (AlphaBeta.burst): refilled at the link's rate while it is idle,
    # capped at its depth, spent on the first bytes of the step's messages
    profile = toy()                      # 4 ms forward, 8 ms backward, 1 MiB of gradients
    slow = AlphaBeta(25e6, 50e-6, "ring")
    empty = predict(profile, 4, slow, fusion_bytes=None, update_s=1e-3)
    (message,) = empty.timeline
    deep = predict(profile, 4, AlphaBeta(25e6, 50e-6, "ring", burst=64 << 10), fusion_bytes=None, update_s=1e-3)
    # idle 13 ms (update + forward + backward) refills 325 kB: the bucket is full, 64 KiB go at once
    assert deep.step_s == pytest.approx(empty.step_s - (64 << 10) / 25e6)
    assert deep.timeline[0].sent == message.sent and deep.wire_bytes == empty.wire_bytes
    # a bucket deeper than the idle spell refills only what that spell gives: the link is never
    # idle in effect, so the step is the empty-bucket all-reduce alone, the compute hidden
    deeper = predict(profile, 4, AlphaBeta(25e6, 50e-6, "ring", burst=1e6), fusion_bytes=None, update_s=1e-3)
    assert deeper.step_s == pytest.approx(message.end - message.start)
    # a bucket deeper than the message: only the latency is left
    tiny = [LayerProfile("l", 1000, 1e-3, 2e-3, (1000,))]
    quick = predict(tiny, 4, AlphaBeta(25e6, 50e-6, "ring", burst=64 << 10), fusion_bytes=None)
    assert quick.timeline[0].end - quick.timeline[0].start == pytest.approx(2 * 3 * 50e-6)
    # per tensor, overlapped: the first message drains the bucket; a gap before the next refills it
    # (at 400 MB/s a layer's 393 kB take 1 ms of its 2 ms backward: 1 ms gaps refill the bucket)
    tensors = predict(profile, 4, AlphaBeta(400e6, 5e-6, "ring", burst=64 << 10), fusion_bytes=0, overlap=True)
    plain = predict(profile, 4, AlphaBeta(400e6, 5e-6, "ring"), fusion_bytes=0, overlap=True)
    saved = [(p.end - p.start) - (t.end - t.start) for p, t in zip(plain.timeline, tensors.timeline)]
    assert saved[0] == pytest.approx(min(64 << 10, tensors.timeline[0].sent) / 400e6)   # a bias: all of it
    assert all(s >= -1e-15 for s in saved) and sum(saved) > 3 * (64 << 10) / 400e6   # refilled between messages
    assert sum(saved) <= (64 << 10) / 25e6 + sum(max(b.start - a.end, 0) for a, b in
                                                zip(tensors.timeline, tensors.timeline[1:])) + 1e-12
    assert predict(profile, 1, AlphaBeta(25e6, 50e-6, "ring", burst=64 << 10)).step_s == pytest.approx(12e-3)
    with pytest.raises(CostError, match="burst must be a number >= 0"):
        AlphaBeta(25e6, 50e-6, "ring", burst=-1)
    assert "64 KiB burst" in AlphaBeta(25e6, 50e-6, burst=64 << 10).describe()


def test_cli_predicts_a_shaped_links_burst(tmp_path, capsys):
    # lenet-sized gradients on 2 ranks at 200 Mbit/s: the 64 KiB bucket is a quarter of the bytes
    profile = tmp_path / "p.csv"
    profile.write_text("name,parameters,forward_s,backward_s\nl,61706,0.003,0.006\n")
    common = ["predict", "--profile", str(profile), "--ranks", "2", "--bandwidth", "2.5e7", "--latency", "1e-4"]
    assert main([*common, "--json", str(tmp_path / "plain.json")]) == 0
    assert main([*common, "--burst", "64K", "--json", str(tmp_path / "burst.json")]) == 0
    assert "64 KiB burst" in capsys.readouterr().out
    plain, burst = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("plain", "burst"))
    assert burst["network"]["burst_bytes"] == 65536 and plain["network"]["burst_bytes"] == 0
    assert plain["rows"][0]["step_s"] - burst["rows"][0]["step_s"] == pytest.approx(65536 / 2.5e7)
