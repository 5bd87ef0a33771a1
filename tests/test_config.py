"""RunConfig: every bad value is a clear error naming the parameter, before anything starts."""
import numpy as np
import pytest

from workbench.config import BETA, ConfigError, RunConfig
from workbench.data import save_arrays


@pytest.mark.parametrize("changes,message", [
    ({"algorithm": "fastest-sgd"}, "algorithm must be one of sync-sgd, async-sgd, async-msgd, hogwild-sgd, easgd"),
    ({"lr": 0}, "lr must be a number > 0"),
    ({"lr": -0.1}, "lr must be a number > 0"),
    ({"lr": float("nan")}, "lr must be a number > 0"),
    ({"lr": "0.1"}, "lr must be a number > 0"),
    ({"rho": -1.0}, "rho must be a number >= 0"),
    ({"rho": 100.0}, "rho: p*lr*rho"),
    ({"tau": 0}, "tau must be an integer >= 1"),
    ({"tau": 1.5}, "tau must be an integer >= 1"),
    ({"ranks": 0}, "ranks must be an integer >= 1"),
    ({"algorithm": "easgd", "ranks": 1}, "ranks must be >= 2 for easgd (rank 0 is the master)"),
    ({"algorithm": "async-sgd", "ranks": 1}, "ranks must be >= 2 for async-sgd"),
    ({"epochs": 0}, "epochs must be an integer >= 1"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"batch_size": 500}, "batch_size 500 is larger than a worker's shard (359 samples"),
    ({"momentum": 1.0}, "momentum must be a number in [0, 1)"),
    ({"momentum": -0.5}, "momentum must be a number in [0, 1)"),
    ({"model": "resnet"}, "model: model must be one of mlp, wide_mlp, cnn or 'module:function'"),
    ({"model": "no_such_module:f"}, "cannot import 'no_such_module'"),
    ({"model": "math:no_such_function"}, "math has no function 'no_such_function'"),
    ({"dataset": "imagenet"}, "dataset must be one of digits, synthetic or a path to an .npz"),
    ({"dataset": "/nonexistent/x.npz"}, "dataset: cannot read"),
    ({"collective": "fastest"}, "collective must be one of auto, native, ring"),
    ({"single_buffer": "yes"}, "single_buffer must be true or false"),
    ({"fail_rank": 1}, "fail_rank and fail_step go together"),
    ({"fail_rank": 7, "fail_step": 1}, "fail_rank must be a rank in 0..3"),
    ({"fail_rank": 1, "fail_step": -1}, "fail_step must be an integer >= 0"),
    ({"seed": -1}, "seed must be an integer >= 0"),
])
def test_bad_values_are_named(changes, message):
    with pytest.raises(ConfigError) as info:
        RunConfig(**changes)
    assert message in str(info.value)


def test_defaults_follow_the_algorithm_and_the_paper():
    cfg = RunConfig(algorithm="sync-easgd", ranks=4)
    assert cfg.workers == 4 and cfg.lr == 0.1
    assert cfg.workers * cfg.lr * cfg.rho == pytest.approx(BETA)  # beta = p*alpha = 0.9
    master = RunConfig(algorithm="async-easgd", ranks=4)
    assert master.workers == 3 and master.workers * master.lr * master.rho == pytest.approx(BETA)
    assert RunConfig(algorithm="async-msgd").momentum == 0.9


def test_round_trip_through_json():
    cfg = RunConfig(algorithm="hogwild-easgd", ranks=3, tau=4, seed=7)
    again = RunConfig.from_dict(__import__("json").loads(cfg.to_json()))
    assert again == cfg


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match=r"unknown RunConfig field\(s\) \['learning_rate'\]"):
        RunConfig.from_dict({"learning_rate": 0.1})


def test_user_arrays_are_checked_for_shard_size(tmp_path):
    rng = np.random.default_rng(0)
    path = save_arrays(tmp_path / "mine.npz", rng.normal(size=(40, 5)), rng.integers(0, 2, 40),
                       rng.normal(size=(10, 5)), rng.integers(0, 2, 10))
    RunConfig(dataset=str(path), ranks=2, batch_size=20)
    with pytest.raises(ConfigError, match="larger than a worker's shard \\(20 samples"):
        RunConfig(dataset=str(path), ranks=2, batch_size=21)
