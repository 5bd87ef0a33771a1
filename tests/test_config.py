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
    ({"model": "resnet"}, "model: model must be one of mlp, wide_mlp, cnn, lenet, resnet18, alexnet or 'module:function'"),
    ({"model": "no_such_module:f"}, "cannot import 'no_such_module'"),
    ({"model": "math:no_such_function"}, "math has no function 'no_such_function'"),
    ({"dataset": "imagenet"}, "dataset must be one of digits, synthetic, synthetic-imagenet, fashion-mnist, idx:FOLDER"),
    ({"dataset": "/nonexistent/x.npz"}, "dataset: cannot read"),
    ({"collective": "fastest"}, "collective must be one of auto, native, ring"),
    ({"overlap": "yes"}, "overlap must be true or false"),
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
    assert cfg.workers == 4 and cfg.hyper.lr == 0.1
    assert cfg.workers * cfg.hyper.lr * cfg.hyper.rho == pytest.approx(BETA)  # beta = p*alpha = 0.9
    master = RunConfig(algorithm="async-easgd", ranks=4)
    assert master.workers == 3 and master.workers * master.hyper.lr * master.hyper.rho == pytest.approx(BETA)
    assert RunConfig(algorithm="async-msgd").hyper.momentum == 0.9
    assert RunConfig(algorithm="async-msgd", momentum=0.5).hyper.momentum == 0.5
    # derived, never written over the caller's fields
    assert (cfg.lr, cfg.rho, cfg.momentum) == (None, None, None)


@pytest.mark.parametrize("values", [
    {"algorithm": "hogwild-easgd", "ranks": 3, "tau": 4, "seed": 7},
    {"algorithm": "sync-sgd", "lr": 0.05, "communication": "fp16"},  # a preset stays a preset
    {"algorithm": "sync-sgd", "ranks": 2},  # lr/rho/momentum derived: read back unchanged, no special case
    {"algorithm": "easgd", "ranks": 3, "fusion_bytes": 0, "extra": {"label": "x"}},
])
def test_round_trip_through_json(values):
    import json
    cfg = RunConfig(**values)
    again = RunConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg and again.to_dict() == cfg.to_dict() and again.hyper == cfg.hyper
    assert {k: v for k, v in cfg.to_dict().items() if k in values} == values


def test_a_preset_is_a_bundle_of_the_real_knobs():
    cfg = RunConfig(algorithm="sync-sgd", communication="fp16")
    assert cfg.communication == "fp16" and cfg.wire_dtype == "fp32"  # the fields say what was given
    opts = cfg.communication_options
    assert (opts.wire_dtype, opts.fusion_bytes, opts.overlap) == ("fp16", 1 << 20, True)


def test_single_buffer_is_a_deprecated_spelling_of_fusion_bytes_0():
    with pytest.warns(DeprecationWarning, match="single_buffer=False is fusion_bytes=0"):
        cfg = RunConfig(algorithm="easgd", ranks=3, single_buffer=False)
    assert cfg.fusion_bytes == 0 and "single_buffer" not in cfg.to_dict()
    with pytest.warns(DeprecationWarning):
        old = RunConfig.from_dict({**RunConfig(algorithm="sync-sgd").to_dict(), "single_buffer": True})
    assert old.fusion_bytes is None
    with pytest.raises(ConfigError, match="fusion_bytes: easgd is master-based: its workers send one message per "
                                          "exchange"):
        RunConfig(algorithm="easgd", ranks=3, fusion_bytes=4096)


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


def test_one_declared_option_reaches_every_reader(tmp_path):
    """label_smoothing is one field in config.py and one use in the rank's loss
    (docs/architecture.md, "How to add an option"): the CLI, the checks, sweeps and the store
    all know it from that declaration."""
    from workbench.cli import build_parser
    from workbench.cli.training import _config
    from workbench.sweep import Sweep
    args = build_parser().parse_args(["train", "--algorithm", "sync-sgd", "--label-smoothing", "0.1"])
    assert _config(args, "sync-sgd").label_smoothing == 0.1
    assert _config(build_parser().parse_args(["train", "--algorithm", "sync-sgd"]), "sync-sgd").label_smoothing == 0
    with pytest.raises(ConfigError, match=r"^label_smoothing must be a number in \[0, 1\); got 1.5$"):
        RunConfig(label_smoothing=1.5)
    sweep = Sweep(RunConfig(algorithm="sync-sgd", ranks=2, epochs=1), {"label_smoothing": [0.0, 0.2]},
                  store=tmp_path / "s.sqlite")
    assert sorted(cfg.label_smoothing for _, cfg in sweep.points) == [0.0, 0.2]
    assert "label_smoothing" in sweep.store.runs().columns


def test_lr_schedule_is_checked_before_any_process_starts():
    from workbench.cli import build_parser
    from workbench.cli.training import _config
    with pytest.raises(ConfigError, match=r"^lr_schedule must be one of constant, cosine, step; got 'linear'$"):
        RunConfig(lr_schedule="linear")
    args = build_parser().parse_args(["train", "--algorithm", "sync-sgd", "--lr-schedule", "cosine"])
    assert _config(args, "sync-sgd").lr_schedule == "cosine" and RunConfig().lr_schedule == "constant"


def test_label_smoothing_reaches_the_ranks_loss(tmp_path):
    """The rank's loss uses it: smoothing raises the training loss's floor (same seed, same batches)."""
    from workbench.runtime.launch.batch import train
    loss = {s: train(RunConfig(algorithm="sync-sgd", ranks=2, epochs=1, label_smoothing=s),
                     tmp_path / str(s))["final_loss"] for s in (0.0, 0.5)}
    assert loss[0.5] > loss[0.0] + 0.2, loss


def test_the_repr_shows_the_algorithm_and_what_differs_from_the_defaults():
    cfg = RunConfig(algorithm="diloco", ranks=8, epochs=3, sync_every=25, lr=0.01)
    assert repr(cfg) == "RunConfig(algorithm='diloco', ranks=8, epochs=3, lr=0.01, sync_every=25)"
    assert repr(RunConfig()) == "RunConfig(algorithm='sync-easgd')"  # the default algorithm, named all the same
    assert eval(repr(cfg), {"RunConfig": RunConfig}) == cfg  # it reads back as the same run
