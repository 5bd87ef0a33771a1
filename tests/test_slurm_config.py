"""Slurm without a running Slurm: ``srun_args`` validated before anything launches, the engines'
batch script (srun arguments, the cluster's own folder), ``--launcher``/``--srun-args`` of the CLI,
srun's labelled output and the rank it blames, the one-line message for ranks that are not one
MPI job. The same paths against a real Slurm: tests/test_slurm.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.config import ConfigError
from workbench.runtime.client.cluster import Cluster
from workbench.runtime.launch import blame, slurm
from workbench.runtime.launch.mpiexec import default_launcher, srun_command


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.mark.parametrize("value,message", [
    ("--mpi=pmi2", "srun_args: expected a list of strings like ['--mpi=pmi2'], got '--mpi=pmi2'"),
    ([2], "srun_args: expected a list of strings like ['--mpi=pmi2'], got [2]"),
    ({"--mpi": "pmi2"}, "srun_args: expected a list of strings"),
])
def test_srun_args_must_be_a_list_of_strings(value, message):
    with pytest.raises(ConfigError) as info:
        Cluster(n=2, engines="slurm", srun_args=value)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_srun_args_and_mpi_args_belong_to_their_launcher():
    with pytest.raises(ConfigError, match=r"srun_args: .*engines='slurm' only; engines='mpi' takes mpi_args"):
        Cluster(n=2, srun_args=["--mpi=pmi2"])
    with pytest.raises(ConfigError, match="mpi_args: arguments of mpiexec, for engines='mpi' only; "
                                          "engines='slurm' takes srun_args"):
        Cluster(n=2, engines="slurm", mpi_args=["-bind-to", "core"])
    with pytest.raises(ConfigError, match="mpi_args: expected a list of strings"):
        Cluster(n=2, mpi_args="-bind-to core")
    with pytest.raises(ConfigError, match="start_timeout: must be a finite number of seconds > 0"):
        Cluster(n=2, engines="slurm", start_timeout=0)


def test_batch_script_runs_srun_with_its_arguments_under_the_rank_guard(state, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = Cluster(n=4, engines="slurm", srun_args=["--mpi=pmi2", "--cpu-bind=none"], queue="debug",
                account="proj42", timelimit="00:10:00", options="#SBATCH --overcommit")
    script = c.batch_script()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    # workbench's default first, the user's after it (srun takes the last value of an option)
    assert srun.startswith("srun --kill-on-bad-exit=1 --mpi=pmi2 --cpu-bind=none "), srun
    assert "rankguard.py" in srun and srun.endswith("-m ipyparallel.engine --mpi"), srun
    for line in ("#SBATCH --ntasks=4", "#SBATCH --partition=debug", "#SBATCH --account=proj42",
                 "#SBATCH --time=00:10:00", "#SBATCH --overcommit"):
        assert line in script, script
    # Slurm's output goes to the cluster's folder under the state directory, never the working one
    output = next(line for line in script.splitlines() if line.startswith("#SBATCH --output="))
    assert output.startswith(f"#SBATCH --output={state / 'batch'}/wb-"), output
    assert sorted(os.listdir(tmp_path)) == ["state"], "the preview wrote into the working directory"


def test_the_engines_launcher_writes_its_files_in_the_state_folder(state, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = Cluster(n=2, engines="slurm", srun_args=["--mpi=pmi2"])
    ipp = c._ipp_cluster()
    launcher = ipp.engine_launcher_class(work_dir=".", parent=ipp, log=ipp.log, profile_dir=ipp.profile_dir,
                                         cluster_id=ipp.cluster_id, engine_set_id="123")
    folder = state / "batch" / ipp.cluster_id
    assert launcher.batch_file == str(folder / "engines-123.sbatch")
    assert launcher.output_file == str(folder / "engines-123.out")
    launcher.write_batch_script(2)
    assert Path(launcher.batch_file).exists() and not (tmp_path / "slurm_engine.sbatch").exists()


def test_not_one_mpi_job_is_one_line_naming_srun_args_and_the_offered_plugins(monkeypatch):
    monkeypatch.setattr(slurm, "mpi_plugins", lambda: ["pmix", "none", "cray_shasta", "pmi2", "pmix_v4"])
    message = slurm.not_one_job_message(4, [1, 1, 1, 1], "srun_args")
    assert "\n" not in message
    assert 'srun_args=["--mpi=pmix"] or ["--mpi=pmi2"]' in message
    assert "each is rank 0 of size 1" in message
    assert "`srun --mpi=list` offers here: pmix, none, cray_shasta, pmi2, pmix_v4" in message
    cli = slurm.not_one_job_message(4, [1], "--srun-args")
    assert "--srun-args=--mpi=pmix or --srun-args=--mpi=pmi2" in cli


def test_mpi_plugins_reads_srun_mpi_list(monkeypatch, tmp_path):
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\necho 'MPI plugin types are...'\nprintf '\\tnone\\n\\tpmi2\\n\\tpmix\\n'\n"
                    "echo 'specific pmix plugin versions available: pmix_v4'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("WORKBENCH_SRUN", str(fake))
    assert slurm.mpi_plugins() == ["none", "pmi2", "pmix", "pmix_v4"]


def test_srun_command_and_the_default_launcher(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_SRUN", "/opt/slurm/bin/srun")
    cmd = srun_command(3, ["-m", "x"], srun_args=["--mpi=pmi2"], guard_dir=tmp_path, name="wb-1")
    assert cmd[:7] == ["/opt/slurm/bin/srun", "-n", "3", "--kill-on-bad-exit=1", "--label", "--job-name=wb-1",
                       "--mpi=pmi2"]
    assert cmd[-3:] == ["mpi4py", "-m", "x"] and cmd[8:10] == ["-I", str(Path(blame.__file__).with_name("rankguard.py"))]
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert default_launcher() == "mpiexec"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert default_launcher() == "srun"


def test_srun_labels_split_the_output_by_rank_and_an_abort_names_the_rank(tmp_path):
    output = "\n".join([
        "0: hello from 0", "2: Traceback (most recent call last):", "2: RuntimeError: boom on 2",
        "2: Abort(1) on node 2 (rank 2 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1) - process 2",
        "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.",
        "0: slurmstepd-vm: error: *** STEP 24.0 ON vm CANCELLED AT 2026-11-24T04:57:23 ***",
        "srun: error: vm: tasks 0-3: Killed"])
    result = blame.collect_output(output, tmp_path, 4, labels=True)
    assert result.ranks[2].startswith("Traceback") and result.ranks[0].startswith("hello from 0")
    result.returncode = 137
    starts = {r: {"rank": r, "pid": 100 + r, "host": "vm"} for r in range(4)}
    # srun SIGKILLs every task at MPI_Abort: a guard that recorded its SIGKILL first is not the cause
    ends = [{"rank": 0, "pid": 100, "host": "vm", "signal": 9, "time": 1.0}]
    error = blame.failure(4, result, starts, ends, abort_kills_all=True)
    assert str(error).startswith("rank 2 on node vm (pid 102) raised an exception and called MPI_Abort with code 1")
    assert error.failed_ranks == [2]


def test_srun_report_names_the_first_task_when_no_guard_recorded(tmp_path):
    output = "1: working\nsrun: error: node7: task 1: Killed\nsrun: error: node7: tasks 0,2-3: Terminated"
    result = blame.collect_output(output, tmp_path, 4, labels=True)
    result.returncode = 137
    error = blame.failure(4, result, {}, [], abort_kills_all=True)
    assert str(error).startswith("rank 1 on node node7 was killed by signal 9 (SIGKILL)"), str(error)


@pytest.mark.parametrize("argv,message", [
    (["--srun-args=--mpi=pmi2"], "--srun-args: only with srun, and the ranks start with mpiexec "
                                 "(SLURM_JOB_ID is not set); add --launcher slurm"),
    (["--launcher", "slurm"], "--launcher: srun not found on PATH"),
    (["--launcher", "srun"], "--launcher: srun not found on PATH"),  # the deprecated word, one release
    (["--launcher", "pbs"], "argument --launcher: must be one of mpi, slurm; got 'pbs'"),
    (["--srun-args=--mpi='pmi2"], "argument --srun-args: cannot split"),
])
def test_cli_launcher_options_are_checked_before_anything_launches(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("WORKBENCH_SRUN", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun on it
    launched = []
    monkeypatch.setattr("workbench.cli.training.BatchRun.run", lambda *a, **k: launched.append(a))
    code = None
    try:
        code = main(["train", "--algorithm", "sync-sgd", "--store", str(tmp_path / "s.sqlite"), *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert launched == []
