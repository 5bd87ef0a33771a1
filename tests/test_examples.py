"""The examples: a researcher's own algorithm (``examples/dpsgd.py``, decentralized SGD) runs with
no edit of the package, under mpiexec and on a virtual cluster's nodes, with what the built-in ones
get: validation, the store, checkpoints and a bitwise resume, the bytes it sends counted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import ConfigError, RunConfig

from engines_fixture import private_cluster

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
WORKBENCH = [sys.executable, "-m", "workbench.cli"]


@pytest.fixture
def examples_on_path(monkeypatch):
    """examples/ on this process's path and the ranks' (PYTHONPATH: the launchers pass the environment)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")])))


def _train(tmp_path: Path, out: Path, *args: str) -> dict:
    proc = subprocess.run([*WORKBENCH, "train", "--algorithm", "dpsgd:DPSGD", "--store", str(tmp_path / "s.sqlite"),
                           "--no-progress", "--out", str(out), *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())


def test_the_definition_is_validated_without_mpi(examples_on_path):
    cfg = RunConfig(algorithm="dpsgd:DPSGD", ranks=4, momentum=0.5)
    assert cfg.spec.name == "d-psgd" and cfg.hyper == (0.1, 0.5, cfg.hyper.rho)
    with pytest.raises(ConfigError, match="^collective: dpsgd:DPSGD runs no all-reduce of its own"):
        RunConfig(algorithm="dpsgd:DPSGD", collective="ring")
    code = ("import sys; sys.path.insert(0, 'examples'); import workbench as wb\n"
            "wb.RunConfig(algorithm='dpsgd:DPSGD', ranks=4)\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'torch')]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.mpi
def test_dpsgd_trains_sends_two_models_a_step_and_resumes_bit_for_bit(examples_on_path, tmp_path):
    whole = _train(tmp_path, tmp_path / "whole", "--ranks", "4", "--epochs", "10")
    assert whole["final_test_accuracy"] >= 0.88  # every built-in algorithm's goal on digits
    model_bytes = 4 * whole["parameters"]
    assert whole["messages_per_step"] == 2 and whole["wire_bytes_per_step"] == 2 * model_bytes  # two neighbours
    # a run stopped after its first epoch and resumed gives the uninterrupted run's weights
    first = _train(tmp_path, tmp_path / "a", "--ranks", "4", "--epochs", "2", "--checkpoint-every", "22")
    half = _train(tmp_path, tmp_path / "b", "--ranks", "4", "--epochs", "1", "--checkpoint-every", "22")
    resumed = _train(tmp_path, tmp_path / "c", "--ranks", "4", "--epochs", "2", "--checkpoint-every", "22",
                     "--resume", str(tmp_path / "b"))
    assert resumed["weights_checksum"] == first["weights_checksum"] != half["weights_checksum"]
    from workbench.store import Store
    runs = Store(tmp_path / "s.sqlite").runs()
    assert set(runs["algorithm"]) == {"dpsgd:DPSGD"} and set(runs["status"]) == {"finished"} and len(runs) == 4
    listed = subprocess.run([*WORKBENCH, "runs", "--algorithm", "dpsgd:DPSGD", "--store", str(tmp_path / "s.sqlite")],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "4 of 4 runs" in listed.stdout, listed.stdout + listed.stderr
    typo = subprocess.run([*WORKBENCH, "runs", "--algorithm", "dpsdg", "--store", str(tmp_path / "s.sqlite")],
                          capture_output=True, text=True, timeout=120)
    assert typo.returncode == 2 and typo.stderr.startswith("workbench runs: error: --algorithm: 'dpsdg' is neither")


@pytest.mark.mpi
def test_dpsgd_from_a_notebook_is_the_cli_run(examples_on_path, tmp_path):
    """wb.Cluster.train on engines (the notebook's path): the run is recorded in the store under the name
    given, and its weights are the CLI run's, bit for bit."""
    cli = _train(tmp_path, tmp_path / "cli", "--ranks", "4", "--epochs", "2")
    from workbench.store import Store
    store = Store(tmp_path / "notebook.sqlite")
    with private_cluster(tmp_path) as cluster:
        result = cluster.train(RunConfig(algorithm="dpsgd:DPSGD", ranks=4, epochs=2), tmp_path / "nb",
                               store=store).wait(timeout=240)
    assert result.status == "finished" and result.summary["weights_checksum"] == cli["weights_checksum"]
    assert store.runs()["algorithm"].tolist() == ["dpsgd:DPSGD"]


@pytest.mark.mpi
@pytest.mark.vcluster
def test_dpsgd_on_a_virtual_cluster_sends_its_models_across_the_links(examples_on_path, vc4, tmp_path):
    """One rank per node: every neighbour exchange crosses a link, both ways."""
    def sent() -> int:  # bytes the shaped links have carried so far
        return sum(link["bytes_sent"] for link in vc4.status()["links"])
    before = sent()
    summary = _train(tmp_path, vc4.shared / "dpsgd", "--ranks", "4", "--epochs", "2", "--vcluster", vc4.name)
    assert summary["ranks"] == 4 and summary["final_test_accuracy"] > 0.5
    assert summary["messages_per_step"] == 2
    assert sent() - before >= 0.95 * summary["bytes_sent"]
