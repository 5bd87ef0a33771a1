"""A user's communication hook, ``RunConfig(comm_hook="module:function")``: checked without
importing it, loaded by the ranks, run for every bucket of real sync-sgd runs (on engines started
with the module on their path), and wrapped in wire precision like the built-in hooks."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workbench.comm.hookspec import check_hook, load_hook
from workbench.config import ConfigError, RunConfig

from engines_fixture import private_cluster, trainer

#: the user's module: ``counting`` does what the built-in dense hook does and counts its calls
#: (each rank writes its count to a file); ``halving`` sums, then halves the sum
USER_HOOKS = '''
import os
from workbench.comm.hooks import Work


def counting(state, bucket) -> Work:
    state.calls = getattr(state, "calls", 0) + 1
    rank = bucket.wire.comm.Get_rank()
    with open(os.path.join(os.environ["WB_HOOK_CALLS"], f"calls-{rank}"), "w") as f:
        f.write(str(state.calls))
    return bucket.wire.allreduce(bucket.buffer, bucket.numel)


def halving(state, bucket) -> Work:
    return bucket.wire.allreduce(bucket.buffer, bucket.numel).then(lambda: bucket.buffer.mul_(0.5))


not_a_function = 3


def takes_one(bucket):  # wrong: a hook takes (state, bucket)
    return None


def keyword_bucket(state, *, bucket):  # wrong: bucket must be positional
    return None


def with_defaults(state, bucket, scale=1.0):  # fine: the extra parameter has a default
    return bucket.wire.allreduce(bucket.buffer, bucket.numel)


def any_arguments(*args):  # fine
    return None
'''

RANKS, TENSORS = 3, 4  # the digits MLP: two Linear layers, weight and bias each


@pytest.fixture(scope="module")
def hook_engines(tmp_path_factory):
    """``(train, folder)``: engines started with the module on their path (PYTHONPATH), writing their
    call counts into ``folder``; ``train(cfg, run_dir)`` runs ``cfg`` on them (:func:`trainer`)."""
    folder = tmp_path_factory.mktemp("hooks")
    (folder / "wb_user_hooks.py").write_text(USER_HOOKS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
        mp.syspath_prepend(str(folder))  # RunConfig finds and loads the hook here too, before the engines do
        mp.setenv("WB_HOOK_CALLS", str(folder))
        with private_cluster(folder) as cluster:
            yield trainer(cluster), folder


@pytest.fixture
def user_hooks(tmp_path, monkeypatch):
    """The module on this process's path and on the ranks' (PYTHONPATH: mpiexec passes the environment)."""
    (tmp_path / "wb_user_hooks.py").write_text(USER_HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("WB_HOOK_CALLS", str(tmp_path))
    monkeypatch.setenv("WORKBENCH_TUNING_CACHE", str(tmp_path / "tuning.json"))
    for name in ("wb_user_hooks", "wb_raising_hooks"):
        sys.modules.pop(name, None)
    return tmp_path


@pytest.mark.parametrize("spec,message", [
    ("nope", "comm_hook must be 'package.module:function'"),
    ("a:b:c", "comm_hook must be 'package.module:function'"),
    ("wb no:f", "comm_hook must be 'package.module:function'"),
    (3, "comm_hook must be 'package.module:function' .* got 3"),
    ("wb_no_such_module:f", "comm_hook 'wb_no_such_module:f': cannot find module 'wb_no_such_module'"),
])
def test_a_bad_hook_name_is_a_one_line_config_error(spec, message):
    with pytest.raises(ConfigError, match=message) as info:
        RunConfig(algorithm="sync-sgd", ranks=2, comm_hook=spec)
    assert "\n" not in str(info.value)


def test_the_module_is_found_not_imported_and_the_ranks_load_the_function(user_hooks):
    check_hook("wb_user_hooks:counting")
    assert "wb_user_hooks" not in sys.modules  # found by its spec: importing may need torch
    assert RunConfig(algorithm="sync-sgd", ranks=2, comm_hook="wb_user_hooks:counting").comm_hook
    assert load_hook("wb_user_hooks:halving").__name__ == "halving"
    with pytest.raises(ValueError, match="comm_hook 'wb_user_hooks:missing': wb_user_hooks has no function 'missing'"):
        load_hook("wb_user_hooks:missing")
    with pytest.raises(ValueError, match="has no function 'not_a_function'"):
        load_hook("wb_user_hooks:not_a_function")


@pytest.mark.parametrize("spec,message", [
    ("os:system", "comm_hook 'os:system': os.system(command) cannot be called as hook(state, bucket) (too many "
                  "positional arguments); give a function of two positional parameters: def hook(state, bucket) -> Work"),
    ("wb_user_hooks:takes_one", "comm_hook 'wb_user_hooks:takes_one': wb_user_hooks.takes_one(bucket) cannot be "
                                "called as hook(state, bucket)"),
    ("wb_user_hooks:keyword_bucket", "comm_hook 'wb_user_hooks:keyword_bucket': wb_user_hooks.keyword_bucket(state, "
                                     "*, bucket) cannot be called as hook(state, bucket)"),
    ("wb_user_hooks:not_a_function", "comm_hook 'wb_user_hooks:not_a_function': wb_user_hooks has no function "
                                     "'not_a_function'"),
    ("wb_user_hooks:missing", "comm_hook 'wb_user_hooks:missing': wb_user_hooks has no function 'missing'"),
    ("wb_raising_hooks:f", "comm_hook 'wb_raising_hooks:f': cannot import 'wb_raising_hooks': RuntimeError: "
                           "import-time failure"),
    # a builtin whose parameters cannot be read: refused, it cannot be shown to take (state, bucket)
    ("builtins:max", "comm_hook 'builtins:max': the parameters of builtins.max cannot be read (a builtin?)"),
])
def test_a_hook_that_cannot_be_called_as_a_hook_is_refused_when_the_config_is_made(spec, message, user_hooks):
    """Loaded once by RunConfig, as a module:function model is built once: the notebook's wb.RunConfig (and so
    Cluster.train) refuses it before any engine runs it; before, every rank failed with a TypeError."""
    (user_hooks / "wb_raising_hooks.py").write_text("raise RuntimeError('import-time failure')\n")
    with pytest.raises(ConfigError) as info:
        RunConfig(algorithm="sync-sgd", ranks=2, comm_hook=spec)
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("name", ["counting", "with_defaults", "any_arguments"])
def test_a_hook_that_takes_state_and_bucket_is_accepted(name, user_hooks):
    assert RunConfig(algorithm="sync-sgd", ranks=2, comm_hook=f"wb_user_hooks:{name}").comm_hook


def test_workbench_train_refuses_a_hook_with_the_wrong_signature_before_the_ranks_start(tmp_path):
    """``--comm-hook os:system`` passed validation, started the ranks, and each failed with ``TypeError:
    system() takes at most 1 argument (2 given)``."""
    out, store = tmp_path / "run", tmp_path / "store.sqlite"
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", "sync-sgd", "--ranks", "2",
                           "--epochs", "1", "--comm-hook", "os:system", "--out", str(out), "--store", str(store)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    err = proc.stderr
    assert proc.returncode == 2, err[-2000:]
    assert err == ("workbench train: error: --comm-hook 'os:system': os.system(command) cannot be called as "
                   "hook(state, bucket) (too many positional arguments); give a function of two positional "
                   "parameters: def hook(state, bucket) -> Work\n"), err[-2000:]
    assert not out.exists() and not store.exists() and proc.stdout == ""  # no run folder, no store row, no run id


def test_a_user_hook_does_not_combine_with_sparse_communication():
    import torch
    from workbench.comm.options import Communication
    from workbench.comm.strategies import make_hook
    with pytest.raises(ValueError, match="comm_hook .* cannot be combined with sparse_ratio"):
        make_hook(Communication(sparse_ratio=0.1), torch.zeros(8), hook=lambda state, bucket: None)


@pytest.mark.mpi
def test_a_user_hook_runs_for_every_bucket_and_changes_what_it_should(hook_engines):
    """``counting`` reduces as the built-in hook does: the same weights bit for bit, the same
    bytes, called once per bucket and step on every rank; under fp16 it is wrapped in wire
    precision as the built-in one is (the same bits again); ``halving`` is the run at half the
    learning rate (halving is exact in binary floating point)."""
    base = dict(algorithm="sync-sgd", ranks=RANKS, epochs=1, collective="ring", fusion_bytes=0, overlap=True)

    train, user_hooks = hook_engines

    def run(name, **extra):
        return train(RunConfig(**base, **extra), user_hooks / name)
    default, counted = run("default"), run("counting", comm_hook="wb_user_hooks:counting")
    assert counted["weights_checksum"] == default["weights_checksum"]
    assert counted["wire_bytes"] == default["wire_bytes"] > 0
    calls = [int((user_hooks / f"calls-{rank}").read_text()) for rank in range(RANKS)]
    assert calls == [counted["steps_per_worker"] * TENSORS] * RANKS
    half = run("fp16", wire_dtype="fp16")
    half_counted = run("fp16-counting", wire_dtype="fp16", comm_hook="wb_user_hooks:counting")
    assert half_counted["weights_checksum"] == half["weights_checksum"] != default["weights_checksum"]
    assert half_counted["wire_bytes"] == half["wire_bytes"] < default["wire_bytes"]
    halved = run("halving", comm_hook="wb_user_hooks:halving")
    slower = run("half-lr", lr=default["hyper"]["lr"] / 2)
    assert halved["weights_checksum"] == slower["weights_checksum"] != default["weights_checksum"]
