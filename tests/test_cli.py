"""The ``workbench`` command: bad input is refused before mpiexec starts; the benchmark runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench.cli import main


@pytest.mark.parametrize("argv,message", [
    (["--algorithms", "ring,fastest"], "--algorithms: unknown 'fastest'; choose 'all' or a comma-separated list of: auto, native, ring"),
    (["--sizes", "4K,lots"], "argument --sizes: 'lots' is not a size: write bytes > 0 like 4096, 64K, 1.5M"),
    (["--sizes", "0"], "argument --sizes: '0' is not a size"),
    (["--ranks", "0"], "argument --ranks: must be an integer >= 1"),
    (["--ranks", "two"], "--ranks: must be an integer >= 1"),
    (["--dtype", "int8"], "--dtype: invalid choice: 'int8' (choose from 'float64', 'float32'"),
])
def test_bad_bench_arguments_name_the_option_and_allowed_values(argv, message, capsys, monkeypatch):
    launched = []
    monkeypatch.setattr("workbench.cli.bench.run_mpi", lambda *a, **k: launched.append(a))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "allreduce", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert launched == []  # nothing was launched


def test_algorithms_lists_every_name(capsys):
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert "collective algorithms: auto, native, ring" in out and "halving_doubling" in out
    for name in ("sync-sgd", "async-sgd", "async-msgd", "hogwild-sgd", "easgd", "async-easgd",
                 "async-measgd", "hogwild-easgd", "sync-easgd"):
        assert f"  {name} " in out


@pytest.mark.mpi
def test_bench_allreduce_prints_a_table_and_writes_json(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TUNING_CACHE", str(tmp_path / "tuning.json"))
    out = tmp_path / "sub" / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "bench", "allreduce", "--ranks", "3",
                           "--sizes", "4K,256K", "--json", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "median ms" in proc.stdout and "busbw GB/s" in proc.stdout and "256KB" in proc.stdout
    report = json.loads(out.read_text())
    assert report["ranks"] == 3
    rows = report["results"]
    for size in (4096, 256 << 10):
        names = {r["algorithm"] for r in rows if r["bytes"] == size}
        assert names == {"auto", "native", "ring", "recursive_doubling", "halving_doubling",
                         "binary_tree", "double_binary_tree", "linear", "gloo"}
    for r in rows:
        assert r["median_s"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["median_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 2 / 3)  # 2(n-1)/n
        assert r["vs_native"] == pytest.approx(
            r["median_s"] / next(x["median_s"] for x in rows
                                 if x["bytes"] == r["bytes"] and x["algorithm"] == "native"))
    assert set(report["auto_choice"]) == {"4K", "256K"}


def test_bench_failure_is_reported_with_exit_code_1(tmp_path, monkeypatch, capsys):
    from workbench.runtime.launch.launcher import MPILaunchError

    def fail(*args, **kwargs):
        raise MPILaunchError("MPI job on 2 ranks exited with code 1: rank(s) 1 failed", [1], "")
    monkeypatch.setattr("workbench.cli.bench.run_mpi", fail)
    assert main(["bench", "allreduce", "--ranks", "2"]) == 1
    assert "rank(s) 1 failed" in capsys.readouterr().err


@pytest.mark.parametrize("algorithm", ["sync-easgd", "easgd", "async-msgd", "sync-sgd"])
def test_train_without_options_is_runconfig_with_its_defaults(algorithm):
    # the CLI takes its defaults from RunConfig: nothing given on the command line means RunConfig's own
    from workbench.cli import build_parser
    from workbench.cli.training import _config
    from workbench.config import RunConfig
    args = build_parser().parse_args(["train", "--algorithm", algorithm])
    assert _config(args, algorithm) == RunConfig(algorithm=algorithm)


def test_every_subcommand_names_the_function_that_runs_it():
    from workbench.cli import build_parser
    parser = build_parser()
    for argv in (["algorithms"], ["runs"], ["simulate", "--topology", "ring:4"], ["calibrate"],
                 ["train", "--algorithm", "easgd"], ["compare", "--algorithms", "easgd"], ["bench", "allreduce"]):
        args = parser.parse_args(argv)
        assert callable(args.func) and args.func.__module__.startswith("workbench.cli"), argv


def _subcommands(parser, prefix=()):
    """``(argv, help)`` for every subcommand of ``parser``, nested ones (``vcluster up``) included."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*prefix, name), helps.get(name)
                yield from _subcommands(sub, (*prefix, name))


def test_help_lists_every_subcommand_with_a_line_that_says_what_it_does(capsys):
    from workbench.cli import build_parser
    commands = list(_subcommands(build_parser()))
    assert not [" ".join(argv) for argv, text in commands if not (text or "").strip()], "subcommands without help"
    for group in {argv[:-1] for argv, _ in commands}:
        with pytest.raises(SystemExit) as exit_info:
            main([*group, "--help"])
        assert exit_info.value.code == 0
        out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
        for argv, text in commands:
            if argv[:-1] == group:
                assert f"{argv[-1]} {' '.join(text.split())}" in out, (group, argv)
    description = build_parser().description
    for argv, _ in commands:
        if len(argv) == 1:  # the overview at the top of `workbench --help` shows every command
            assert f"workbench {argv[0]}" in description, argv


def test_predict_names_the_flag_for_a_collective_without_a_closed_form(capsys):
    assert main(["predict", "--collective", "double_binary_tree", "--ranks", "2"]) == 2
    err = capsys.readouterr().err
    assert "--simulate" in err and "Simulated" not in err
    assert err.count("\n") == 1  # one line


def _file(path):
    path.write_text("not a directory")
    return path


# An output file whose folder cannot be made, or a folder given for it: one line naming the option before
# anything runs. Before: bench's rank 0 failed after the benchmark (a traceback and MPI_Abort), simulate and
# predict raised a traceback after their work, plan said `[Errno 2] ...` without naming --json, and `vcluster
# up --shared` raised a traceback from os.mkdir. (id, argv with {bad} for the path, {t} tmp_path)
OUTPUT_FILES = [
    ("bench-json", ["bench", "allreduce", "--ranks", "2", "--sizes", "4K", "--algorithms", "ring", "--no-gloo",
                    "--repetitions", "1", "--warmup", "1", "--json", "{bad}"], "workbench bench allreduce: error: --json"),
    ("simulate-json", ["simulate", "--topology", "ring:4", "--sizes", "4K", "--json", "{bad}"],
     "workbench simulate: error: --json"),
    ("predict-json", ["predict", "--ranks", "2", "--json", "{bad}"], "workbench predict: error: --json"),
    ("plan-json", ["plan", "--model", "vgg16", "--batch", "32", "--gpus", "8", "--data-parallel", "--json", "{bad}"],
     "workbench plan: error: --json"),
    ("vcluster-shared", ["vcluster", "up", "wbt", "--nodes", "2", "--shared", "{bad}"],
     "workbench vcluster up: error: --shared"),
]
#: (id, tmp_path -> the bad path, what the message says after the option)
BAD_OUTPUTS = [
    ("under-a-file", lambda t: f"{_file(t / 'f')}/out/x.json",
     ": cannot create '{t}/f/out/x.json': '{t}/f' is a file, not a directory; give a "),
    ("in-proc", lambda t: "/proc/wb-out/x.json",
     ": cannot create '/proc/wb-out/x.json': nothing can be created in '/proc' (No such file or directory); give a "),
]


@pytest.mark.parametrize("bad,after", [b[1:] for b in BAD_OUTPUTS], ids=[b[0] for b in BAD_OUTPUTS])
@pytest.mark.parametrize("argv,before", [o[1:] for o in OUTPUT_FILES], ids=[o[0] for o in OUTPUT_FILES])
def test_an_output_path_that_cannot_be_written_is_one_line_before_anything_runs(argv, before, bad, after, tmp_path):
    if "/proc/" in after and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    path = bad(tmp_path)
    env = {**os.environ, "WORKBENCH_STATE_DIR": str(tmp_path / "state"),
           "WORKBENCH_TUNING_CACHE": str(tmp_path / "tuning.json")}
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", *[a.format(bad=path) for a in argv]],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    err = proc.stderr
    assert proc.returncode == 2, err[-2000:]
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err, err[-2000:]  # one line
    assert err.startswith(before + after.format(t=tmp_path)), err
    assert proc.stdout == ""  # nothing ran: no table, no MPI job, no cluster
    assert not (tmp_path / "state").exists() and not (tmp_path / "tuning.json").exists()


@pytest.mark.parametrize("argv,before", [o[1:] for o in OUTPUT_FILES if o[0] != "vcluster-shared"],
                         ids=[o[0] for o in OUTPUT_FILES if o[0] != "vcluster-shared"])
def test_an_output_path_that_is_a_folder_is_one_line_naming_the_option(argv, before, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", *[a.format(bad=tmp_path) for a in argv]],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env={**os.environ, "WORKBENCH_TUNING_CACHE": str(tmp_path / "tuning.json")})
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert proc.stderr == f"{before}: {str(tmp_path)!r} is a directory; give a file path you can write\n"


def test_simulate_json_creates_its_folder_as_predict_does(tmp_path):
    out = tmp_path / "new" / "sub" / "sim.json"
    assert main(["simulate", "--topology", "ring:4", "--sizes", "4K", "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["bytes"] == 4096
