"""The algorithm registry: one entry per name with its implementation classes and properties;
the rest of the code asks the entry, never compares names."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import RunConfig, ignored_options, options, scoped
from workbench.optim.registry import ALGORITHMS, algorithms

ROOT = Path(__file__).resolve().parent.parent


def test_the_registry_loads_without_torch_or_mpi():
    code = ("import sys\nfrom workbench.optim.registry import ALGORITHMS\nimport workbench as wb\n"
            "assert len(wb.algorithms()) == 12 and ALGORITHMS['easgd'].master_based\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mpi4py'))\nassert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_algorithms_of_the_design_in_the_papers_order_then_the_descendants():
    assert list(algorithms()) == ["sync-sgd", "async-sgd", "async-msgd", "hogwild-sgd", "easgd", "async-easgd",
                                  "async-measgd", "hogwild-easgd", "sync-easgd", "local-sgd", "diloco", "streaming-diloco"]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_rank_gets_a_class_with_run(name):
    spec = ALGORITHMS[name]
    master, worker = spec.implementation_class(0), spec.implementation_class(1)
    assert callable(master.run) and callable(worker.run)
    assert (master is not worker) == spec.master_based
    assert spec.synchronous != spec.master_based  # the two families of the paper


def test_the_master_based_classes_carry_the_differences():
    cls = {name: (s.implementation_class(0).__name__, s.implementation_class(1).__name__)
           for name, s in ALGORITHMS.items()}
    assert cls["easgd"] == ("RoundRobinMaster", "RoundRobinElasticWorker")
    assert cls["hogwild-easgd"] == ("HogwildMaster", "ElasticWorker")
    assert cls["hogwild-sgd"] == ("HogwildMaster", "GradientWorker")
    assert cls["async-easgd"] == ("Master", "ElasticWorker")
    assert not ALGORITHMS["easgd"].implementation_class(1).overlaps_exchange
    assert ALGORITHMS["async-easgd"].implementation_class(1).overlaps_exchange


def test_no_algorithm_name_is_compared_outside_the_registry():
    names = "|".join(re.escape(n) for n in ALGORITHMS)
    compared = re.compile(rf"""(==|!=|startswith\()\s*["']({names}|hogwild|async|sync)""")
    for path in ("workbench/optim/master.py", "workbench/optim/sync.py", "workbench/optim/periodic.py",
                 "workbench/runtime/rank/worker.py"):
        text = (ROOT / path).read_text()
        assert not compared.search(text), path
        assert not re.search(rf"""\{{\s*["']({names})["']\s*:""", text), f"{path}: a name -> class map"


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_an_option_is_refused_exactly_when_the_entry_does_not_use_it(name):
    spec = ALGORITHMS[name]
    set_values = {"collective": "ring", "tau": 4, "rho": 0.5, "momentum": 0.5, "fusion_bytes": 0,
                  "wire_dtype": "fp16", "sparse_ratio": 0.1}
    refused = {option for option, _ in ignored_options(name, set_values)}
    assert refused == {option for option in set_values if not spec.uses(option)}
    assert "fusion_bytes" not in refused  # every algorithm can send one message per tensor


PERIODIC_OPTIONS = ("sync_every", "warmup_steps", "inner_optimizer", "weight_decay")
OUTER_OPTIONS = ("outer_lr", "outer_momentum", "nesterov", "outer_wire_dtype")
STREAMING_OPTIONS = ("fragments", "sync_delay", "fragment_alpha")


def test_options_of_the_descendants():
    uses = {name: set(s.options) for name, s in ALGORITHMS.items()}
    assert uses["local-sgd"] == {"collective", "momentum", *PERIODIC_OPTIONS}
    assert uses["diloco"] == {"collective", "momentum", *PERIODIC_OPTIONS, *OUTER_OPTIONS}
    assert uses["streaming-diloco"] == {"collective", "momentum", *PERIODIC_OPTIONS, *OUTER_OPTIONS,
                                        *STREAMING_OPTIONS}
    assert not any(set(PERIODIC_OPTIONS) & uses[name] for name, s in ALGORITHMS.items() if not s.periodic)
    assert not ALGORITHMS["diloco"].reduces_gradients and not ALGORITHMS["diloco"].uses("tau")


def test_options_of_the_families():
    uses = {name: sorted(s.options) for name, s in ALGORITHMS.items()}
    assert uses["sync-sgd"] == ["collective", "comm_hook", "momentum", "sparse_ratio", "wire_dtype"]
    assert uses["sync-easgd"] == ["collective", "rho", "tau"]  # weights: no wire/sparse
    assert uses["async-measgd"] == ["momentum", "rho", "tau"]
    assert all("rho" in s.options for s in ALGORITHMS.values() if s.elastic)
    assert all("collective" not in s.options for s in ALGORITHMS.values() if s.master_based)
    assert all(not {"wire_dtype", "sparse_ratio"} & s.options for s in ALGORITHMS.values() if s.master_based)
    assert all(s.uses("fusion_bytes") and s.uses("epochs") for s in ALGORITHMS.values())  # options of all


def test_each_option_is_declared_once_with_what_every_reader_needs():
    declared = options()
    assert list(declared)[:3] == ["algorithm", "ranks", "model"] and "single_buffer" not in declared
    for name, opt in declared.items():
        assert opt.name == name and opt.help, name
        assert opt.flag is None or opt.flag == "--" + name.replace("_", "-"), name
    assert set(scoped()) == {"rho", "tau", "momentum", "collective", "wire_dtype", "sparse_ratio", "comm_hook",
                             *PERIODIC_OPTIONS, *OUTER_OPTIONS, *STREAMING_OPTIONS}
    from workbench.optim.definition import SCOPED
    assert set(scoped()) == SCOPED  # what the definitions list their options from
    # the CLI reads them: every flag of a declared option is a flag of `workbench train`
    from workbench.cli import build_parser
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = {s for action in train._actions for s in action.option_strings}
    assert {opt.flag for opt in declared.values() if opt.flag} <= flags


def test_config_reads_the_registry():
    assert RunConfig(algorithm="easgd", ranks=3).spec is ALGORITHMS["easgd"]
    assert RunConfig(algorithm="easgd", ranks=3).workers == 2 and RunConfig(algorithm="sync-sgd").workers == 4
