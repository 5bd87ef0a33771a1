"""Bad input is refused before any launch (issue 11, part 7 and 8): one line naming the parameter.

Every case runs through ``workbench train`` (exit 2, ``workbench train: error: ...`` or argparse's
``argument --x: ...``, no traceback, mpiexec never started) and, where it is a RunConfig value,
through ``RunConfig`` too (``ConfigError``, never TypeError/AttributeError).
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.config import ConfigError, RunConfig
from workbench.data import IDX_FILES

ROOT = Path(__file__).resolve().parent.parent

USER_MODELS = textwrap.dedent("""
    import torch
    def raises(n, c):
        raise ValueError("factory says no")
    def not_module(n, c):
        return 42
    def wrong_output(n, c):
        return torch.nn.Linear(n, c + 3)
    def wrong_input(n, c):
        return torch.nn.Linear(n + 5, c)
    def good(n, c):
        return torch.nn.Linear(n, c)
""")


def _npz(path: Path, **changes) -> str:
    rng = np.random.default_rng(0)
    arrays = {"X_train": rng.normal(size=(40, 5)), "y_train": rng.integers(0, 3, 40),
              "X_test": rng.normal(size=(10, 5)), "y_test": rng.integers(0, 3, 10)}
    arrays.update(changes)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return str(path)


def _other_run(path: Path, **config) -> str:
    """A run directory with a checkpoint (the manifest and every rank's file), as a finished sync run
    leaves it."""
    path.mkdir()
    cfg = RunConfig(**{"algorithm": "sync-easgd", "ranks": 2, **config})
    (path / "config.json").write_text(cfg.to_json())
    (path / "checkpoint" / "step-000040").mkdir(parents=True)
    for rank in range(cfg.ranks):
        (path / "checkpoint" / "step-000040" / f"rank{rank}.pt").write_bytes(b"")  # only looked for before launch
    (path / "checkpoint" / "latest.json").write_text(json.dumps({"step": 40, "ranks": cfg.ranks}))
    return str(path)


def _idx_folder(path: Path, damage: str) -> str:
    """``idx:FOLDER`` of a small MNIST-format set with one file damaged: ``gzip`` (the test labels are
    not gzip), ``cut`` (the training labels' gzip stream ends early) or ``short`` (the raw training
    images hold half the bytes their header says)."""
    import gzip
    path.mkdir()
    shapes = {"X_train": (200, 4, 4), "y_train": (200,), "X_test": (10, 4, 4), "y_test": (10,)}  # shards of 50
    for key, name in IDX_FILES.items():
        shape = shapes[key]
        payload = bytes([0, 0, 0x08, len(shape)]) + b"".join(n.to_bytes(4, "big") for n in shape)
        payload += bytes(i % 3 for i in range(int(np.prod(shape))))
        if key == "X_train":
            (path / name).write_bytes(payload[:len(payload) - 1600] if damage == "short" else payload)
            continue
        packed = gzip.compress(payload)
        if key == "y_test" and damage == "gzip":
            packed = b"not gzip at all"
        if key == "y_train" and damage == "cut":
            packed = packed[:len(packed) // 2]
        (path / (name + ".gz")).write_bytes(packed)
    return f"idx:{path}"


# (id, tmp_path -> RunConfig kwargs (also given to `workbench train` as options), message)
CASES = [
    ("model-import-raises", lambda t: ({"model": "wb_raising_module:f"}), "cannot import 'wb_raising_module': "
                                                                           "RuntimeError: import-time failure"),
    ("model-missing-module", lambda t: ({"model": "wb_no_such_module:f"}), "cannot import 'wb_no_such_module'"),
    ("model-factory-raises", lambda t: ({"model": "wb_user_models:raises"}), "raised ValueError: factory says no"),
    ("model-not-module", lambda t: ({"model": "wb_user_models:not_module"}), "returned int, not a torch.nn.Module"),
    ("model-output-size", lambda t: ({"model": "wb_user_models:wrong_output"}),
     "output must be (batch, 10) class scores for the data's 10 classes; got (2, 13)"),
    ("model-input-size", lambda t: ({"model": "wb_user_models:wrong_input"}), "its input does not fit the data"),
    ("model-none", lambda t: ({"model": None}), "model must be a string; got NoneType"),
    ("npz-empty", lambda t: ({"dataset": _npz(t / "e.npz", X_train=None, y_train=None, X_test=None,
                                              y_test=None)}), "lacks arrays"),
    ("npz-strings", lambda t: ({"dataset": _npz(t / "s.npz", X_train=np.array([["a"] * 5] * 40))}),
     "X_train must hold numbers; got dtype <U1"),
    ("npz-objects", lambda t: ({"dataset": _npz(t / "o.npz", y_train=np.array([1] * 39 + [None], dtype=object))}),
     "holds Python objects"),
    ("npz-lengths", lambda t: ({"dataset": _npz(t / "l.npz", y_train=np.zeros(39, dtype=np.int64))}),
     "y_train must be one label per sample of X_train (40)"),
    ("npz-float-labels", lambda t: ({"dataset": _npz(t / "f.npz", y_train=np.zeros(40))}),
     "y_train must hold integer class labels"),
    ("npz-huge-label", lambda t: ({"dataset": _npz(t / "h.npz", y_test=np.array([0] * 9 + [10**9]))}),
     "y_test labels must be class indices in 0..99999; got 1000000000"),
    ("npz-negative-label", lambda t: ({"dataset": _npz(t / "n.npz", y_train=np.array([-1] + [0] * 39))}),
     "y_train labels must be class indices in 0..99999; got -1"),
    ("npz-nan", lambda t: ({"dataset": _npz(t / "nan.npz", X_train=np.full((40, 5), np.nan))}),
     "X_train holds NaN or infinite values"),
    ("npz-inf", lambda t: ({"dataset": _npz(t / "inf.npz", X_test=np.full((10, 5), np.inf))}),
     "X_test holds NaN or infinite values"),
    ("npz-empty-test", lambda t: ({"dataset": _npz(t / "et.npz", X_test=np.zeros((0, 5)),
                                                   y_test=np.zeros(0, dtype=np.int64))}), "X_test is empty"),
    ("dataset-path-object", lambda t: ({"dataset": t / "x.npz"}), "dataset must be a string; got PosixPath"),
    # an MNIST-format folder whose files cannot be read was a gzip traceback, or failed on the ranks
    ("idx-not-gzip", lambda t: ({"dataset": _idx_folder(t / "idx", "gzip")}),
     "dataset: cannot read '{t}/idx/t10k-labels-idx1-ubyte.gz': BadGzipFile: Not a gzipped file"),
    ("idx-gzip-cut", lambda t: ({"dataset": _idx_folder(t / "idx", "cut")}),
     "dataset: cannot read '{t}/idx/train-labels-idx1-ubyte.gz': EOFError: Compressed file ended"),
    ("idx-raw-short", lambda t: ({"dataset": _idx_folder(t / "idx", "short")}),
     "dataset: '{t}/idx/train-images-idx3-ubyte': 1600 bytes of data for shape (200, 4, 4) (cut short?)"),
    ("algorithm-list", lambda t: ({"algorithm": ["sync-sgd"]}), "algorithm must be a string; got list"),
    ("fail-rank-bool", lambda t: ({"fail_rank": True, "fail_step": 3}), "fail_rank must be a rank in 0..3"),
    ("seed-negative", lambda t: ({"seed": -1}), "seed must be an integer"),
    ("seed-too-big", lambda t: ({"seed": 2**32}), "seed must be an integer in 0..4294967295"),
    ("seed-2-64", lambda t: ({"seed": 2**64}), "seed must be an integer in 0..4294967295"),
    ("collective-on-master", lambda t: ({"algorithm": "async-easgd", "collective": "ring"}),
     "collective: async-easgd runs no all-reduce of its own"),
    ("tau-on-sync-sgd", lambda t: ({"algorithm": "sync-sgd", "tau": 4}), "tau: sync-sgd ignores tau=4; leave it at 1"),
    ("rho-on-sgd", lambda t: ({"algorithm": "async-sgd", "rho": 1.0}), "rho: async-sgd has no elastic term"),
    ("momentum-on-easgd", lambda t: ({"algorithm": "sync-easgd", "momentum": 0.9}),
     "momentum: sync-easgd does not use momentum"),
    # gradient communication (GradientFlow)
    ("fusion-on-master", lambda t: ({"algorithm": "async-sgd", "fusion_bytes": 4096}),
     "fusion_bytes: async-sgd is master-based"),
    ("fusion-negative", lambda t: ({"algorithm": "sync-sgd", "fusion_bytes": -1}),
     "fusion_bytes must be an integer >= 0"),
    ("fusion-contradicts-single-buffer", lambda t: ({"algorithm": "sync-sgd", "single_buffer": False,
                                                     "fusion_bytes": 4096}), "single_buffer=False is fusion_bytes=0"),
    ("wire-dtype-on-sync-easgd", lambda t: ({"algorithm": "sync-easgd", "wire_dtype": "fp16"}),
     "wire_dtype: sync-easgd all-reduces weights, not gradients"),
    ("wire-dtype-on-master", lambda t: ({"algorithm": "async-easgd", "wire_dtype": "bf16"}),
     "wire_dtype: async-easgd is master-based"),
    ("wire-dtype-unknown", lambda t: ({"algorithm": "sync-sgd", "wire_dtype": "fp8"}),
     "wire_dtype must be one of fp32, fp16, bf16; got 'fp8'"),
    ("sparse-on-sync-easgd", lambda t: ({"algorithm": "sync-easgd", "sparse_ratio": 0.1}),
     "sparse_ratio: sync-easgd all-reduces weights, not gradients"),
    ("sparse-ratio-zero", lambda t: ({"algorithm": "sync-sgd", "sparse_ratio": 0}),
     "sparse_ratio must be a number in (0, 1]"),
    ("sparse-ratio-above-one", lambda t: ({"algorithm": "sync-sgd", "sparse_ratio": 1.5}),
     "sparse_ratio must be a number in (0, 1]"),
    ("sparse-chunk-zero", lambda t: ({"algorithm": "sync-sgd", "sparse_ratio": 0.1, "sparse_chunk": 0}),
     "sparse_chunk must be an integer >= 1"),
    ("warmup-without-sparse", lambda t: ({"algorithm": "sync-sgd", "warmup_epochs": 2}),
     "warmup_epochs is an option of coarse-grained sparse communication; set sparse_ratio"),
    ("warmup-negative", lambda t: ({"algorithm": "sync-sgd", "sparse_ratio": 0.1, "warmup_epochs": -1}),
     "warmup_epochs must be an integer >= 0"),
    ("no-residual-without-sparse", lambda t: ({"algorithm": "sync-sgd", "residual": False}),
     "residual is an option of coarse-grained sparse communication"),
    ("communication-unknown", lambda t: ({"algorithm": "sync-sgd", "communication": "turbo"}),
     "communication must be one of dense, per-tensor, fused, fp16, bf16, csc, gradientflow"),
    ("communication-unknown-option", lambda t: ({"algorithm": "sync-sgd", "communication": {"fusion": 1}}),
     "communication: unknown option(s) ['fusion']"),
    ("communication-contradicts", lambda t: ({"algorithm": "sync-sgd", "communication": "fp16", "wire_dtype": "bf16"}),
     "wire_dtype='bf16' contradicts communication='fp16'"),
    ("communication-on-master", lambda t: ({"algorithm": "async-sgd", "communication": "fp16"}),
     "async-sgd is master-based"),
]

_CLI_NAMES = {"model": "--model", "dataset": "--dataset", "algorithm": "--algorithm", "seed": "--seed",
              "collective": "--collective", "tau": "--tau", "rho": "--rho", "momentum": "--momentum",
              "fail_rank": "--fail-rank", "fail_step": "--fail-step", "fusion_bytes": "--fusion-bytes",
              "wire_dtype": "--wire-dtype", "sparse_ratio": "--sparse-ratio", "sparse_chunk": "--sparse-chunk",
              "warmup_epochs": "--warmup-epochs", "communication": "--communication"}
#: cases the command line cannot even express (a Python object where argv has strings, a flag
#: with no value, a value argparse refuses itself: see CLI_CASES)
_PYTHON_ONLY = {"model-none", "dataset-path-object", "algorithm-list", "fail-rank-bool", "fusion-negative",
                "fusion-contradicts-single-buffer", "no-residual-without-sparse", "communication-unknown-option"}

# command-line-only cases: (id, tmp_path -> argv after `train --algorithm sync-easgd`, message)
CLI_CASES = [
    ("out-is-a-file", lambda t: ["--out", _file(t / "f")], "--out: "),
    ("resume-is-a-file", lambda t: ["--resume", _file(t / "f")], "--resume: "),
    ("resume-missing", lambda t: ["--resume", str(t / "nothing")], "is missing"),
    ("resume-other-model", lambda t: ["--ranks", "2", "--resume", _other_run(t / "r", model="cnn")],
     "--resume: {t}/r is a checkpoint of another run: model 'cnn' (checkpoint) vs 'mlp' (this run)"),
    ("resume-other-algorithm", lambda t: ["--ranks", "2", "--resume", _other_run(t / "r", algorithm="sync-sgd")],
     "algorithm 'sync-sgd' (checkpoint) vs 'sync-easgd' (this run)"),
    ("resume-other-ranks", lambda t: ["--ranks", "3", "--resume", _other_run(t / "r")],
     "ranks 2 (checkpoint) vs 3 (this run)"),
    ("resume-no-checkpoint", lambda t: ["--ranks", "2", "--resume", _without(_other_run(t / "r"), "checkpoint")],
     "has no checkpoint/latest.json"),
    ("resume-no-config", lambda t: ["--ranks", "2", "--resume", _without(_other_run(t / "r"), "config.json")],
     "--resume: {t}/r has no config.json"),
    ("resume-empty", lambda t: ["--resume", str(_mkdir(t / "empty"))], "empty has no config.json"),
    ("resume-incomplete", lambda t: ["--ranks", "2", "--resume",
                                     _without(_other_run(t / "r"), "checkpoint/step-000040/rank1.pt")],
     "--resume: {t}/r has an incomplete checkpoint: checkpoint/step-000040/rank1.pt is missing (checkpoint/"
     "latest.json names step 40 of 2 ranks); resume from a run whose checkpoint is whole"),
    ("out-holds-a-run", lambda t: ["--ranks", "2", "--out", _other_run(t / "done")], "already holds a run"),
    ("timeout-zero", lambda t: ["--timeout", "0"], "argument --timeout: must be a finite number of seconds > 0"),
    ("timeout-negative", lambda t: ["--timeout", "-5"], "argument --timeout: must be a finite number"),
    ("timeout-inf", lambda t: ["--timeout", "inf"], "argument --timeout: must be a finite number"),
    ("timeout-nan", lambda t: ["--timeout", "nan"], "argument --timeout: must be a finite number"),
    ("fusion-bytes-text", lambda t: ["--algorithm", "sync-sgd", "--fusion-bytes", "lots"],
     "argument --fusion-bytes: must be 0 (one message per tensor), inf or none (one message per step), or a size "
     "like 4096, 64K, 1.5M; got 'lots'"),
    ("fusion-bytes-negative", lambda t: ["--algorithm", "sync-sgd", "--fusion-bytes", "-4"],
     "argument --fusion-bytes: must be 0 (one message per tensor), inf or none"),
    ("no-residual-dense", lambda t: ["--algorithm", "sync-sgd", "--no-residual"],
     "residual is an option of coarse-grained sparse communication"),
    ("per-layer-and-fusion", lambda t: ["--algorithm", "sync-sgd", "--per-layer", "--fusion-bytes", "1M"],
     "--per-layer is --fusion-bytes 0 (one message per tensor); it contradicts --fusion-bytes 1048576"),
]


def _file(path: Path) -> str:
    path.write_text("not a directory")
    return str(path)


def _without(run_dir: str, part: str) -> str:
    """``run_dir`` with ``part`` (a file or a folder in it) removed."""
    path = Path(run_dir) / part
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    return run_dir


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    (tmp_path / "wb_user_models.py").write_text(USER_MODELS)
    (tmp_path / "wb_raising_module.py").write_text("raise RuntimeError('import-time failure')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("wb_user_models", "wb_raising_module"):
        sys.modules.pop(name, None)
    monkeypatch.chdir(tmp_path)  # the store, if one were opened, goes here
    return tmp_path


@pytest.fixture
def launches(monkeypatch):
    """mpiexec replaced by a recorder: every case must leave it empty."""
    launched = []
    monkeypatch.setattr("workbench.runtime.launch.batch.run_mpi", lambda *a, **k: launched.append(a))
    return launched


def _train(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(["train", *argv])
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("build,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_run_config_values_are_config_errors(build, message, user_modules):
    kwargs = build(user_modules)
    with pytest.raises(ConfigError) as info:
        RunConfig(**kwargs)
    assert message.format(t=user_modules) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("build,message", [c[1:] for c in CASES if c[0] not in _PYTHON_ONLY],
                         ids=[c[0] for c in CASES if c[0] not in _PYTHON_ONLY])
def test_bad_values_stop_workbench_train_before_launch(build, message, user_modules, launches, capsys):
    kwargs = {"algorithm": "sync-easgd", **build(user_modules)}
    argv = [arg for name, value in kwargs.items() for arg in (_CLI_NAMES[name], str(value))]
    code, err = _train(argv, capsys)
    assert code == 2 and launches == []
    from workbench.cli.training import flag_of
    message = message.format(t=user_modules)
    assert err.startswith("workbench train: error: ") and flag_of(message) in err, err  # flags, not field names
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("build,message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_paths_and_timeouts_stop_workbench_train_before_launch(build, message, user_modules, launches,
                                                                   capsys):
    code, err = _train(["--algorithm", "sync-easgd", *build(user_modules)], capsys)
    assert code == 2 and launches == []
    assert message.format(t=user_modules) in err, err
    assert "Traceback" not in err and "error" in err.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["soon", "2", "nan", "-5"])
def test_a_bad_heartbeat_timeout_stops_a_virtual_cluster_run_before_anything_starts(value, launches, capsys,
                                                                                     monkeypatch):
    """``$WORKBENCH_HEARTBEAT_TIMEOUT`` (the silence after which a virtual cluster's node counts as lost) that is no
    number of seconds of at least three heartbeats: one line naming it, from the CLI and from ``wb.Cluster``."""
    from workbench.runtime.client.cluster import Cluster
    monkeypatch.setenv("WORKBENCH_HEARTBEAT_TIMEOUT", value)
    code, err = _train(["--algorithm", "sync-sgd", "--vcluster", "no-such-cluster"], capsys)
    said = f"WORKBENCH_HEARTBEAT_TIMEOUT={value!r}: the seconds of silence after which a node counts as lost, " \
           "a number >= 3 (default 10)"
    assert code == 2 and launches == [] and said in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(ConfigError, match="WORKBENCH_HEARTBEAT_TIMEOUT="):
        Cluster(n=2, vcluster="no-such-cluster")
    monkeypatch.setenv("WORKBENCH_HEARTBEAT_TIMEOUT", "4.5")
    from workbench.runtime.launch.heartbeat import Listener
    listener = Listener("127.0.0.1", 2)
    try:
        assert listener.timeout == 4.5  # what the launcher and the cluster's engines then wait for
    finally:
        listener.close()


def test_a_good_user_model_passes_and_keeps_the_callers_random_state(user_modules):
    import torch
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    RunConfig(model="wb_user_models:good", ranks=2)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("dataset", ["digits", "npz"])
def test_a_matching_checkpoint_is_accepted(dataset, tmp_path):
    """With an .npz data set too, compared by real path (that comparison raised NameError: no ``os``)."""
    from workbench.runtime.rank import checkpoint
    data = {} if dataset == "digits" else {"dataset": _npz(tmp_path / "d.npz"), "batch_size": 4}
    checkpoint.check_resume(_other_run(tmp_path / "r", **data),
                            RunConfig(algorithm="sync-easgd", ranks=2, epochs=3, **data))


def test_a_run_folder_without_config_json_is_refused(tmp_path):
    """Without config.json the algorithm, model and dataset cannot be compared: refused, not skipped."""
    from workbench.runtime.rank import checkpoint
    run_dir = _without(_other_run(tmp_path / "r", model="cnn"), "config.json")  # another model's checkpoint
    with pytest.raises(ConfigError) as info:
        checkpoint.check_resume(run_dir, RunConfig(algorithm="sync-easgd", ranks=2, epochs=3))
    assert str(info.value) == (f"resume: {run_dir} has no config.json (every run writes one; without it the "
                               f"checkpoint's algorithm, model, dataset cannot be checked): give a run directory")


# Where a run or the store would be written cannot be: refused by the real command before anything is
# created or started (a raw FileNotFoundError/NotADirectoryError traceback from os.mkdir before).
# (id, tmp_path -> (argv, environment), message: {t} is tmp_path)
UNWRITABLE = [
    ("out-in-proc", lambda t: (["train", "--out", "/proc/wb-run"], {}),
     "workbench train: error: --out: cannot create '/proc/wb-run': nothing can be created in '/proc'"),
    ("out-under-a-file", lambda t: (["train", "--out", f"{_file(t / 'f')}/run"], {}),
     "workbench train: error: --out: cannot create '{t}/f/run': '{t}/f' is a file, not a directory; give a folder "
     "you can write"),
    ("default-runs-under-a-file", lambda t: (["train"], {"WORKBENCH_RUNS": f"{_file(t / 'f')}/runs"}),
     "workbench train: error: --out: cannot create '{t}/f/runs': '{t}/f' is a file, not a directory; the runs go "
     "there without --out: give --out DIR or set WORKBENCH_RUNS"),
    ("store-in-proc", lambda t: (["train", "--store", "/proc/wb.sqlite"], {}),
     "workbench train: error: --store: cannot create '/proc/wb.sqlite': nothing can be created in '/proc'"),
    ("store-under-a-file", lambda t: (["train", "--store", f"{_file(t / 'f')}/s.sqlite"], {}),
     "workbench train: error: --store: cannot create '{t}/f/s.sqlite': '{t}/f' is a file, not a directory"),
    ("store-is-a-folder", lambda t: (["train", "--store", str(_mkdir(t / "d"))], {}),
     "workbench train: error: --store: '{t}/d' is a directory; give --store FILE in a folder you can write"),
    ("compare-out-in-proc", lambda t: (["compare", "--out", "/proc/wb-runs"], {}),
     "workbench compare: error: --out: cannot create '/proc/wb-runs/sync-sgd': nothing can be created in '/proc'"),
    ("compare-out-under-a-file", lambda t: (["compare", "--out", f"{_file(t / 'f')}/runs"], {}),
     "workbench compare: error: --out: cannot create '{t}/f/runs/sync-sgd': '{t}/f' is a file, not a directory"),
    ("compare-run-is-a-file", lambda t: (["compare", "--out", _holding_a_file(t / "c", "sync-sgd")], {}),
     "workbench compare: error: --out: '{t}/c/sync-sgd' is a file, not a directory; give a folder you can write"),
]


def _holding_a_file(path: Path, name: str) -> str:
    path.mkdir()
    _file(path / name)
    return str(path)


@pytest.mark.parametrize("case,build,message", UNWRITABLE, ids=[c[0] for c in UNWRITABLE])
def test_unwritable_run_and_store_paths_stop_the_command_before_anything_starts(case, build, message, tmp_path):
    argv, env = build(tmp_path)
    runs, store = tmp_path / "runs", tmp_path / "store.sqlite"
    env = {**os.environ, "WORKBENCH_RUNS": str(runs), "WORKBENCH_STORE": str(store), **env}
    command = argv[0]
    argv = [command, "--algorithm" if command == "train" else "--algorithms", "sync-sgd", "--ranks", "2",
            "--epochs", "1", *argv[1:]]
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", *argv], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=env)
    err = proc.stderr
    assert proc.returncode == 2, err[-2000:]
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err, err[-2000:]  # one line
    assert err.startswith(message.format(t=tmp_path)), err
    # nothing was created or started: no run folder, no store (it is opened after the checks), no probe left
    assert not runs.exists() and not store.exists() and proc.stdout == ""
    assert not [p for p in tmp_path.rglob(".workbench-probe-*")]


def test_a_run_folder_that_cannot_be_made_is_a_config_error_in_the_notebook_too(tmp_path):
    """make_run_dir is what wb.Cluster.train's Run calls (its ``run_dir``): a ConfigError naming the argument,
    never the OSError of os.mkdir, and nothing made."""
    from workbench.runtime.rundir import make_run_dir
    bad = [(f"{_file(tmp_path / 'f')}/run", f"run_dir: cannot create '{tmp_path}/f/run': '{tmp_path}/f' is a file")]
    if Path("/proc/self").is_dir():
        bad.append(("/proc/wb-run", "run_dir: cannot create '/proc/wb-run': nothing can be created in '/proc'"))
    for path, message in bad:
        with pytest.raises(ConfigError) as info:
            make_run_dir(path)
        assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_compare_drops_options_an_algorithm_ignores_with_a_note(tmp_path, monkeypatch, capsys, launches):
    """compare shares its options among algorithms: an ignored one is left out for that algorithm."""
    from workbench.cli import build_parser
    from workbench.cli.training import _config
    args = build_parser().parse_args(["compare", "--algorithms", "sync-sgd,sync-easgd", "--tau", "4"])
    assert _config(args, "sync-sgd", shared=True).tau == 1
    assert "sync-sgd ignores --tau" in capsys.readouterr().err
    assert _config(args, "sync-easgd", shared=True).tau == 4


def test_a_sweep_over_algorithms_runs_ignored_options_without_them(tmp_path):
    from workbench.sweep import Sweep
    with pytest.warns(UserWarning, match="sync-sgd ignores tau"):
        sweep = Sweep(RunConfig(algorithm="sync-easgd", ranks=2, epochs=1),
                      {"algorithm": ["sync-easgd", "sync-sgd"], "tau": [1, 4]}, store=tmp_path / "s.sqlite")
    taus = {(cfg.algorithm, json.loads(key)["tau"]): cfg.tau for key, cfg in sweep.points}
    assert taus == {("sync-easgd", 1): 1, ("sync-easgd", 4): 4, ("sync-sgd", 1): 1, ("sync-sgd", 4): 1}


def test_validating_built_in_models_and_data_imports_neither_torch_nor_mpi():
    code = ("import sys, workbench as wb\n"
            "wb.RunConfig(algorithm='sync-easgd', model='cnn', dataset='digits')\n"
            "wb.RunConfig(algorithm='async-easgd', model='wide_mlp', dataset='synthetic')\n"
            "assert 'torch' not in sys.modules and 'mpi4py.MPI' not in sys.modules, "
            "[m for m in sys.modules if m.startswith(('torch', 'mpi4py'))][:5]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- issue 11, part 8 -------------------------------------------------------------------------

class _Planted:
    """Unpickling this runs ``os.mkdir(path)``: what a planted checkpoint could do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_checkpoints_load_weights_only_even_where_torch_defaults_otherwise(tmp_path, monkeypatch):
    """torch < 2.6 unpickles anything by default; TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD gives that default
    here. Only an explicit weights_only=True keeps a planted file from running code."""
    import pickle

    import torch

    from workbench.runtime.rank import checkpoint
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "code-ran"
    (tmp_path / "checkpoint" / "async").mkdir(parents=True)
    torch.save({"step": 3, "x": _Planted(str(marker)), "ranks": 2}, tmp_path / "checkpoint" / "async" / "rank0.pt")
    (tmp_path / "checkpoint" / "step-000040").mkdir()
    torch.save({"step": 40, "x": _Planted(str(marker))}, tmp_path / "checkpoint" / "step-000040" / "rank0.pt")
    (tmp_path / "checkpoint" / "latest.json").write_text(json.dumps({"step": 40, "ranks": 2}))
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load_own(tmp_path, 0, 2)
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(tmp_path, 0, 2)
    assert not marker.exists()
    # what the algorithms save still loads
    torch.save({"step": 3, "x": torch.arange(4.0), "ranks": 2}, tmp_path / "checkpoint" / "async" / "rank1.pt")
    assert checkpoint.load_own(tmp_path, 1, 2)["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # the usual default, under which files are world-readable
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_store_and_run_directories_are_private_unless_shared(tmp_path, monkeypatch, umask_022):
    from workbench.runtime.rundir import make_run_dir
    from workbench.store import Store
    monkeypatch.delenv("WORKBENCH_SHARED", raising=False)
    store = Store(tmp_path / "private.sqlite")
    reader = sqlite3.connect(store.path)  # an open connection keeps -wal and -shm on disk
    reader.execute("SELECT COUNT(*) FROM runs").fetchone()
    store.start_run("r", {"algorithm": "sync-sgd", "ranks": 2})
    assert _mode(store.path) == 0o600
    assert _mode(Path(f"{store.path}-wal")) == 0o600 and _mode(Path(f"{store.path}-shm")) == 0o600
    reader.close()
    assert _mode(make_run_dir(tmp_path / "runs" / "one")) == 0o700
    monkeypatch.setenv("WORKBENCH_SHARED", "1")
    assert _mode(Store(tmp_path / "shared.sqlite").path) == 0o644
    assert _mode(make_run_dir(tmp_path / "runs" / "two")) == 0o755
