"""One loop (``workbench.optim.trainer.Trainer``) owns resume, checkpoints, evaluation points, cancel
and stop points for every family, the master-based family's master too: the algorithms supply their
step and exchange (a master: its serving), and no other class in ``workbench.optim`` resumes, writes a
checkpoint or decides an evaluation point."""
from __future__ import annotations

import ast
import json
import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import workbench.optim
from workbench.config import RunConfig
from workbench.optim.master import HogwildMaster, Master, RoundRobinMaster
from workbench.optim.trainer import Trainer
from workbench.runtime.launch.batch import train
from workbench.runtime.launch.launcher import MPILaunchError
from workbench.runtime.rank import checkpoint

OPTIM = Path(workbench.optim.__file__).parent
#: what only the loop does: its methods, and the calls that resume, write checkpoints or evaluate
LOOP_METHODS = {"run", "_resume", "save_checkpoint", "evaluation_point"}
LOOP_CALLS = {"save", "save_own", "load", "load_own", "evaluate", "is_eval_point"}


def _loop_parts(tree: ast.AST) -> dict[str, list[str]]:
    """Per class of a module: the loop's methods it defines and the loop's calls it makes."""
    found = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        defined = [f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and f.name in LOOP_METHODS]
        called = [f"{ast.unparse(c.func)}" for c in ast.walk(cls) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and c.func.attr in LOOP_CALLS
                  and (c.func.attr in ("evaluate", "is_eval_point") or ast.unparse(c.func.value) == "checkpoint")]
        if defined or called:
            found[cls.name] = defined + called
    return found


def test_only_the_trainer_resumes_checkpoints_and_evaluates():
    owners = {}
    for path in sorted(OPTIM.glob("*.py")):
        for name, parts in _loop_parts(ast.parse(path.read_text())).items():
            owners[f"{path.name}:{name}"] = parts
    assert set(owners) == {"trainer.py:Trainer"}, owners
    assert set(owners["trainer.py:Trainer"]) >= {"run", "_resume", "checkpoint.save", "checkpoint.save_own",
                                                 "checkpoint.load_own", "ctx.evaluate", "ctx.is_eval_point"}


def test_the_check_sees_a_class_with_a_loop_of_its_own():
    own = ast.parse("class M:\n    def run(self, resume_dir=None):\n"
                    "        state = checkpoint.load_own(resume_dir, 0, 2)\n"
                    "        self.ctx.evaluate(self.state, arrivals=1)\n")
    assert _loop_parts(own) == {"M": ["run", "checkpoint.load_own", "self.ctx.evaluate"]}


def test_every_master_is_on_the_one_loop_counting_arrivals():
    for cls in (Master, RoundRobinMaster, HogwildMaster):
        assert issubclass(cls, Trainer) and not cls.lockstep and cls.unit == "arrivals"
        assert cls.run is Trainer.run and cls.loop is not Trainer.loop
    assert Trainer.unit == "step"


def _master(tmp_path, checkpoint_every=20):
    """A master on a stand-in context (no MPI): the spans it opens, the live channel's flushes and the metric
    records it makes are recorded, in order."""
    cfg = RunConfig(algorithm="async-easgd", ranks=3, checkpoint_every=checkpoint_every)
    spans = []

    @contextmanager
    def span(name, cat, **args):
        spans.append((name, cat, args))
        yield

    ctx = SimpleNamespace(cfg=cfg, flat=SimpleNamespace(data=torch.arange(4.0)), data=SimpleNamespace(train_samples=64),
                          rank=0, size=3, out_dir=tmp_path, span=span, flush=lambda: spans.append(("flush",)),
                          add_metric=lambda record: spans.append(("metric", record)), now=lambda: 1.5)
    return Master(ctx), spans


def test_a_masters_checkpoint_is_the_loops_and_one_from_before_still_loads(tmp_path):
    master, spans = _master(tmp_path)
    assert isinstance(master.checkpoint_lock, type(threading.Lock()))  # hogwild threads write one at a time
    master.weights.fill_(3.0)
    master.velocity.fill_(0.5)
    for n in (19, 20, 21):
        master.save_checkpoint(n)
    # the records up to a checkpoint are sent before it is written (a restart from it loses none)
    assert spans == [("flush",), ("checkpoint", "io", {"arrivals": 20})]
    saved = torch.load(tmp_path / "checkpoint" / "async" / "rank0.pt", weights_only=True)
    assert list(saved) == ["arrivals", "state", "velocity", "ranks"] and saved["arrivals"] == 20
    assert torch.equal(saved["state"], torch.full((4,), 3.0)) and torch.equal(saved["velocity"], torch.full((4,), 0.5))
    # a master's checkpoint as the master wrote it before it was on the loop: the same keys
    old = tmp_path / "old"
    checkpoint.save_own(old, 0, 3, {"arrivals": 40, "state": torch.full((4,), 7.0), "velocity": torch.ones(4)})
    resumed, said = _master(tmp_path / "new")
    resumed.loop = lambda: None  # the serving needs MPI; the resume and the weights returned are the loop's
    assert torch.equal(resumed.run(old), torch.full((4,), 7.0))
    assert said == [("metric", {"kind": "resume", "rank": 0, "arrivals": 40, "t": 1.5})]  # where it went on
    assert torch.equal(resumed.velocity, torch.ones(4)) and next(resumed.arrivals) == 41


# -- under mpiexec ---------------------------------------------------------------------------------

def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.mpi
def test_a_resumed_master_based_run_repeats_the_uninterrupted_one(tmp_path, monkeypatch):
    """async-easgd with one worker (one arrival order) and tau 1: the worker's checkpoint at step 40 and
    the master's at arrival 40 are the same moment, so a run resumed from them repeats the uninterrupted
    run bit for bit, the master's cosine learning rate by arrivals included."""
    monkeypatch.setenv("WORKBENCH_TUNING_CACHE", str(tmp_path / "tuning.json"))
    base = dict(algorithm="async-easgd", ranks=2, tau=1, epochs=2, checkpoint_every=20, lr_schedule="cosine")
    whole = train(RunConfig(**base), tmp_path / "whole")
    with pytest.raises(MPILaunchError) as info:
        train(RunConfig(**base, fail_rank=1, fail_step=45), tmp_path / "broken")
    assert info.value.failed_ranks == [1]
    saved = {r: torch.load(tmp_path / "broken" / "checkpoint" / "async" / f"rank{r}.pt") for r in (0, 1)}
    assert saved[0]["arrivals"] == 40 and saved[1]["step"] == 40
    resumed = train(RunConfig(**base), tmp_path / "resumed", resume=tmp_path / "broken")
    assert (resumed["final_test_accuracy"], resumed["final_loss"]) == (whole["final_test_accuracy"], whole["final_loss"])

    def master_evals(run_dir):
        return [(m["arrivals"], m["lr"], m["test_loss"]) for m in _records(run_dir)
                if m["kind"] == "eval" and "arrivals" in m and m["arrivals"] > 40]
    assert master_evals(tmp_path / "resumed") == master_evals(tmp_path / "whole") != []
    for r in (0, 1):  # the last checkpoints too
        ends = [torch.load(tmp_path / run / "checkpoint" / "async" / f"rank{r}.pt") for run in ("whole", "resumed")]
        assert ends[0].keys() == ends[1].keys()
        assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                   for a, b in zip(ends[0].values(), ends[1].values()))
    spans = [e for e in json.loads((tmp_path / "whole" / "trace.json").read_text())["traceEvents"]
             if e.get("ph") == "X" and e["name"] == "checkpoint"]
    assert {e["pid"]: e["args"] for e in spans if e["args"].get("arrivals") == 20 or e["args"].get("step") == 20} == \
        {0: {"arrivals": 20}, 1: {"step": 20}}
