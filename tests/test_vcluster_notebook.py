"""wb.Cluster on a virtual cluster: ipyparallel engines on the nodes, the kernel on the head. What a
notebook does across nodes with private /tmp: the live stream, cancel, a killed engine named by rank
and node, a partition named within a minute, a sweep into the store; the controller and the stream
listen on the head's bridge address.

The session's state folder is under /tmp, which the nodes do not see: the cluster's own files go to
the virtual cluster's shared folder, and so do runs without a run directory.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from workbench.config import ConfigError, RunConfig
from workbench.runtime.client.cluster import Cluster
from workbench.runtime.client.run import RunError
from workbench.store import Store
from workbench.sweep import Sweep

pytestmark = [pytest.mark.mpi, pytest.mark.vcluster]


@pytest.fixture(scope="module")
def cluster(vc4):
    with Cluster(n=4, vcluster=vc4) as c:
        yield c
    assert [vc4.processes(i) for i in range(4)] == [[], [], [], []]  # stop() left nothing on any node


def test_engines_run_on_the_nodes_and_listen_on_the_head_address(cluster, vc4):
    assert cluster.hosts == {i: f"{vc4.name}-{i}" for i in range(4)}
    assert all(vc4.processes(i) for i in range(4))
    assert cluster.listen_ip == cluster.advertised_ip == vc4.head_address
    assert str(cluster.files).startswith(str(vc4.shared))  # the state folder is under /tmp: nodes would not see it
    connection = json.loads(next((cluster.files / "ipython" / "security").glob("ipcontroller-*-engine.json")).read_text())
    assert connection["location"] == vc4.head_address and vc4.head_address in connection["interface"]


def test_a_run_streams_live_data_from_the_nodes_and_crosses_the_links(cluster, vc4):
    before = vc4.bytes_sent()
    run = cluster.train(RunConfig(algorithm="sync-easgd", ranks=4, epochs=3), store=False)
    assert str(run.run_dir).startswith(str(vc4.shared / "runs"))  # the default runs folder is not seen there
    assert run.address.startswith(f"tcp://{vc4.head_address}:")
    seen = 0
    while not run.done():
        seen = max(seen, len(run.history))
        time.sleep(0.05)
    result = run.wait(60)
    assert seen > 0 and len(result.history) >= seen
    assert {int(r) for r in result.history["rank"].dropna().unique()} >= {1, 2, 3}
    assert vc4.bytes_sent() - before > result.summary["bytes_sent"]


def test_cancel_reaches_the_ranks_on_the_nodes(cluster, vc4):
    run = cluster.train(RunConfig(algorithm="sync-sgd", ranks=4, epochs=500), vc4.shared / "nb-cancel", store=False)
    time.sleep(2)
    result = run.cancel(timeout=30)
    assert run.status == "cancelled" and result.summary.get("cancelled")
    assert cluster.healthy()


def test_a_killed_engine_is_named_by_rank_node_and_pid(cluster, vc4):
    run = cluster.train(RunConfig(algorithm="sync-sgd", ranks=4, epochs=500), vc4.shared / "nb-kill", store=False)
    time.sleep(2)
    pid = cluster.pids[3]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RunError) as info:
        run.wait(60)
    assert str(info.value).startswith(f"rank 3 on node {vc4.name}-3 (pid {pid}) was killed by signal 9")
    assert info.value.rank == 3 and cluster.healthy()


def test_a_partition_is_named_within_a_minute_and_the_cluster_trains_again(cluster, vc4, tmp_path):
    store = Store(tmp_path / "store.sqlite")
    run = cluster.train(RunConfig(algorithm="sync-sgd", ranks=4, epochs=500), vc4.shared / "nb-part", store=store)
    time.sleep(2)
    cut = time.monotonic()
    try:
        vc4.set_link(1, False)
        with pytest.raises(RunError) as info:
            run.wait(90)
        assert time.monotonic() - cut < 60
        assert str(info.value).startswith(f"node {vc4.name}-1 stopped answering") and info.value.rank == 1
        assert store.runs().set_index("run_id").loc[run.run_id, "status"] == "failed"
    finally:
        vc4.set_link(1, True)
    result = cluster.train(RunConfig(algorithm="sync-easgd", ranks=4, epochs=1), vc4.shared / "nb-after",
                           store=False).wait(120)
    assert result.status == "finished"


def test_a_sweep_on_the_nodes_records_every_point(cluster, vc4, tmp_path):
    store = Store(tmp_path / "sweep.sqlite")
    sweep = Sweep(RunConfig(algorithm="sync-easgd", ranks=4, epochs=1), grid={"tau": [1, 2]}, store=store)
    frame = sweep.run(cluster, progress=False)
    assert len(frame) == 2 and set(store.runs()["status"]) == {"finished"}
    assert all(str(d).startswith(str(vc4.shared)) for d in store.runs()["run_dir"])


def test_bad_input_names_the_option(vc4, tmp_path):
    with pytest.raises(ConfigError, match="^vcluster: ppn: 8 ranks at 1 per node need 8 nodes"):
        Cluster(n=8, vcluster=vc4)
    with pytest.raises(ConfigError, match="^engines: vcluster .* has no Slurm"):
        Cluster(n=2, engines="slurm", vcluster=vc4)
    with pytest.raises(ConfigError, match="^reachable: "):
        Cluster(n=2, vcluster=vc4, reachable=True)
    with pytest.raises(ConfigError, match="^ppn: "):
        Cluster(n=2, ppn=2)
    with pytest.raises(ConfigError, match="^vcluster: .* is not up"):
        Cluster(n=2, vcluster="nosuch")
