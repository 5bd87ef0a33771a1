"""An algorithm is one definition (``workbench.optim.definition``): the configuration, the ranks and
the predictor read the same object, and a researcher's definition in their own module
(``algorithm="package.module:NAME"``) is validated, run and predicted like a built-in one, with no
edit of the package."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import ConfigError, RunConfig
from workbench.netsim.predict import PREDICTABLE, PredictError, predict, predict_config
from workbench.netsim.profile import LayerProfile
from workbench.optim import ALGORITHMS, LockStep, MasterBased, Periodic, definition_of
from workbench.optim.definition import DefinitionError

ROOT = Path(__file__).resolve().parent.parent

USER_ALGORITHMS = '''
from workbench.optim import LockStep, MasterBased
from workbench.optim.definition import COLLECTIVE, ELASTIC, GRADIENT_STRATEGIES, MOMENTUM, PERIOD

# sync-SGD again under another name: the same classes, so the same weights for a seed
MY_SGD = LockStep(name="my-sgd", description="sync-SGD, defined outside the package",
                  worker="workbench.optim.sync:SyncSGD", default_momentum=0.9, exchange="gradients",
                  options=COLLECTIVE + MOMENTUM + GRADIENT_STRATEGIES)
# an elastic master-based algorithm whose workers take a larger step, and no exchange declared
MY_EASGD = MasterBased(name="my-easgd", description="async EASGD at lr 0.2",
                       worker="workbench.optim.master:ElasticWorker", master="workbench.optim.master:Master",
                       default_lr=0.2, options=PERIOD + ELASTIC)
NOT_ONE = "a string"
TYPO = LockStep(name="typo", description="", worker="workbench.optim.sync:SyncSGD", options={"collective", "rhoo"})
'''


@pytest.fixture
def user_algorithms(tmp_path, monkeypatch):
    """The module on this process's path and the ranks' (PYTHONPATH: mpiexec passes the environment)."""
    (tmp_path / "wb_user_algorithms.py").write_text(USER_ALGORITHMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    sys.modules.pop("wb_user_algorithms", None)
    yield tmp_path
    sys.modules.pop("wb_user_algorithms", None)


def toy() -> list[LayerProfile]:
    """Two layers of the digits MLP's sizes, 2 and 1 ms forward, twice that backward."""
    return [LayerProfile("fc1", 4096, 0.002, 0.004, (4000, 96)), LayerProfile("fc2", 1034, 0.001, 0.002, (1024, 10))]


def test_a_definition_in_the_users_module_is_validated_as_a_built_in_one(user_algorithms):
    cfg = RunConfig(algorithm="wb_user_algorithms:MY_SGD", ranks=2, wire_dtype="fp16")
    assert cfg.spec.name == "my-sgd" and cfg.spec.reduces_gradients and cfg.hyper.momentum == 0.9
    with pytest.raises(ConfigError, match=r"^rho: wb_user_algorithms:MY_SGD has no elastic term and ignores rho=0.5"):
        RunConfig(algorithm="wb_user_algorithms:MY_SGD", rho=0.5)
    easgd = RunConfig(algorithm="wb_user_algorithms:MY_EASGD", ranks=3, tau=2)
    assert easgd.workers == 2 and easgd.hyper.lr == 0.2 and easgd.hyper.rho == pytest.approx(0.9 / (2 * 0.2))
    with pytest.raises(ConfigError, match="ranks must be >= 2 for wb_user_algorithms:MY_EASGD"):
        RunConfig(algorithm="wb_user_algorithms:MY_EASGD", ranks=1)
    with pytest.raises(ConfigError, match="fusion_bytes: wb_user_algorithms:MY_EASGD is master-based"):
        RunConfig(algorithm="wb_user_algorithms:MY_EASGD", ranks=3, fusion_bytes=4096)


@pytest.mark.parametrize("name,message", [
    ("wb_user_algorithms:NOT_ONE", "wb_user_algorithms.NOT_ONE is a str, not an Algorithm"),
    ("wb_user_algorithms:MISSING", "wb_user_algorithms.MISSING is missing, not an Algorithm"),
    ("wb_no_such_module:X", "cannot import 'wb_no_such_module': ModuleNotFoundError"),
    ("adam", "algorithm must be one of sync-sgd, async-sgd"),
    ("a:b:c", "or 'package.module:NAME'"),
    ("wb_user_algorithms:TYPO", "its definition takes rhoo, which no option is"),
])
def test_a_name_that_is_no_definition_is_one_line(user_algorithms, name, message):
    with pytest.raises(ConfigError) as info:
        RunConfig(algorithm=name)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_definition_that_cannot_work_is_refused_when_it_is_made():
    with pytest.raises(DefinitionError, match="exchange must be one of gradients"):
        LockStep(name="x", description="", worker="m:C", exchange="gossip")
    with pytest.raises(DefinitionError, match="what a MasterBased algorithm has, and only it"):
        LockStep(name="x", description="", worker="m:C", master="m:M")
    with pytest.raises(DefinitionError, match="what a MasterBased algorithm has"):
        MasterBased(name="x", description="", worker="m:C")
    with pytest.raises(DefinitionError, match="worker must be 'package.module:Class'"):
        Periodic(name="x", description="", worker="Class")


def test_the_predictor_reads_the_definition_not_a_list_of_its_own(user_algorithms):
    assert PREDICTABLE == tuple(n for n, a in ALGORITHMS.items() if a.exchange is not None)
    mine = predict_config(RunConfig(algorithm="wb_user_algorithms:MY_SGD", ranks=4, fusion_bytes=0), toy())
    theirs = predict_config(RunConfig(algorithm="sync-sgd", ranks=4, fusion_bytes=0), toy())
    assert (mine.algorithm, mine.step_s, mine.messages) == ("my-sgd", theirs.step_s, theirs.messages)
    with pytest.raises(PredictError, match="my-easgd declares none"):
        predict_config(RunConfig(algorithm="wb_user_algorithms:MY_EASGD", ranks=3), toy())


@pytest.mark.parametrize("name", PREDICTABLE)
def test_every_predictable_algorithm_is_predicted_from_its_run_config_with_its_own_period(name):
    """The period the ranks use (tau or sync_every, as the family says) is the one predicted: a run's
    config and the predictor cannot drift apart."""
    spec = ALGORITHMS[name]
    period = spec.period if spec.uses(spec.period or "") else None
    ranks = 3 if spec.master_based else 2
    base = RunConfig(algorithm=name, ranks=ranks)
    got = predict_config(base, toy())
    assert got.algorithm == name and got.step_s > 0
    if period is not None:
        longer = predict_config(RunConfig(algorithm=name, ranks=ranks, **{period: 40}), toy())
        direct = predict(toy(), ranks, None, base.communication_options, algorithm=name, tau=40)
        assert longer.step_s == pytest.approx(direct.step_s) and longer.wire_bytes < got.wire_bytes
        other = "sync_every" if period == "tau" else "tau"
        with pytest.raises(ConfigError, match=f"^{other}: "):
            RunConfig(algorithm=name, ranks=ranks, **{other: 8})


def test_nothing_outside_the_registry_compares_algorithm_names():
    """config, the predictor and the dashboard ask the definition; no name is compared or listed there."""
    names = "|".join(re.escape(n) for n in ALGORITHMS)
    compared = re.compile(rf"""(==|!=|\bin\s*\(|startswith\()\s*["']({names})["']""")
    listed = re.compile(rf"""\(\s*["']({names})["']\s*,\s*["']({names})["']""")
    for path in ("workbench/config.py", "workbench/netsim/predict.py", "workbench/netsim/exchanges.py",
                 "workbench/dashboard/figures.py", "workbench/dashboard/__init__.py", "workbench/results.py"):
        text = (ROOT / path).read_text()
        assert not compared.search(text), (path, compared.search(text))
        assert not listed.search(text), (path, listed.search(text))


@pytest.mark.mpi
def test_the_cli_trains_the_users_algorithm_as_the_built_in_one_it_equals(user_algorithms, tmp_path):
    """``workbench train --algorithm package.module:NAME``: the ranks import the definition too; the same
    classes give the same weights as sync-sgd, bit for bit; the store keeps the name the user gave."""
    def train(algorithm: str, out: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", algorithm, "--ranks", "2",
                               "--epochs", "1", "--out", str(tmp_path / out), "--store", str(tmp_path / "s.sqlite"),
                               "--no-progress"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return json.loads((tmp_path / out / "summary.json").read_text())
    mine, theirs = train("wb_user_algorithms:MY_SGD", "mine"), train("sync-sgd", "theirs")
    assert mine["config"]["algorithm"] == "wb_user_algorithms:MY_SGD"
    assert mine["weights_checksum"] == theirs["weights_checksum"]
    easgd = train("wb_user_algorithms:MY_EASGD", "easgd")
    assert easgd["final_test_accuracy"] > 0.5 and "weights_checksum" not in easgd
    from workbench.store import Store
    assert set(Store(tmp_path / "s.sqlite").runs()["algorithm"]) == {"wb_user_algorithms:MY_SGD", "sync-sgd",
                                                                      "wb_user_algorithms:MY_EASGD"}
