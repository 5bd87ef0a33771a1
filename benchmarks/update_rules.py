"""What the EASGD family's updates cost on the CPU, functional against in place: each rule of
``workbench.optim.rules`` that a training loop applies every step (or every arrival at the master)
on a flat tensor of a model's size, one process, one thread.

Functional: the pure formula (fresh model-sized tensors each call), its result copied back into
the weights, as the loops did before 2026-11-27; in place: its twin (``sgd_``,
``elastic_worker_``, ..., ``adamw_``; the same bits, tests/test_rules.py) with scratch tensors made
once. Median wall milliseconds and minor page faults a call over ``--steps`` calls after one.
The functional form's temporaries are above glibc's mmap threshold for these sizes, so each is
mapped fresh and faulted in page by page (the sync-SGD update's finding, benchmarks/README.md).

    python benchmarks/update_rules.py [--models resnet18,alexnet] [--steps 5] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from workbench.bench.machine import Load, describe, wall_and_faults  # noqa: E402
from workbench.optim import rules  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: flat parameter counts: lenet (28x28x1), resnet18 (28x28x1), alexnet (224x224x3, 1000 classes), as the workbench builds them
MODELS = {"lenet": 61_706, "resnet18": 11_172_810, "alexnet": 61_100_840}
LR, RHO, MU, P = 0.01, 0.9, 0.9, 4


def pairs(n: int) -> dict:
    """rule -> (functional call copied back, in-place call) on fresh tensors of ``n`` elements."""
    x, v, m, g, c = (torch.randn(n) for _ in range(5))
    v2 = v.abs()
    s1, s2 = torch.empty(n), torch.empty(n)

    def back(*pairs_):  # the loops' copy of each new tensor into the old one
        for new, old in pairs_:
            old.copy_(new)

    def adamw_functional():
        new_x, new_m, new_v = rules.adamw(x, m, v2, g, 3, LR, 0.01)
        back((new_x, x), (new_m, m), (new_v, v2))

    return {
        "sgd": (lambda: back((rules.sgd(x, g, LR), x)), lambda: rules.sgd_(x, g, LR, s1)),
        "momentum_sgd": (lambda: back(*zip(rules.momentum_sgd(x, v, g, LR, MU), (x, v))),
                         lambda: rules.momentum_sgd_(x, v, g, LR, MU, s1)),
        "elastic_worker": (lambda: back((rules.elastic_worker(x, g, c, LR, RHO), x)),
                           lambda: rules.elastic_worker_(x, g, c, LR, RHO, s1, s2)),
        "momentum_elastic_worker": (lambda: back(*zip(rules.momentum_elastic_worker(x, v, g, c, LR, RHO, MU), (x, v))),
                                    lambda: rules.momentum_elastic_worker_(x, v, g, c, LR, RHO, MU, s1, s2)),
        "elastic_center": (lambda: back((rules.elastic_center(c, x, LR, RHO), c)),
                           lambda: rules.elastic_center_(c, x, LR, RHO, s1)),
        "elastic_center_sync": (lambda: back((rules.elastic_center_sync(c, x, LR, RHO, P), c)),
                                lambda: rules.elastic_center_sync_(c, x, LR, RHO, P, s1)),
        "adamw": (adamw_functional, lambda: rules.adamw_(x, m, v2, g, 3, LR, 0.01, s1, s2)),
    }


def model_names(text: str) -> list[str]:
    """``--models``: comma-separated names of :data:`MODELS`."""
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(MODELS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{unknown or text!r}: give some of {', '.join(MODELS)}")
    return names


def steps_count(text: str) -> int:
    """``--steps``: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"an integer >= 1; got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=model_names, default="resnet18,alexnet", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=steps_count, default=5, help="timed calls per rule (>= 1; default 5)")
    parser.add_argument("--json", type=Path, default=RESULTS / "update_rules.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load, started, rows = Load(), time.time(), []
    for name in args.models:
        for rule, (functional, in_place) in pairs(MODELS[name]).items():
            f_ms, f_faults = wall_and_faults(functional, args.steps)
            i_ms, i_faults = wall_and_faults(in_place, args.steps)
            rows.append({"model": name, "parameters": MODELS[name], "rule": rule, "functional_ms": f_ms,
                         "functional_faults": f_faults, "in_place_ms": i_ms, "in_place_faults": i_faults})
    report = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "total_seconds": time.time() - started,
              "machine": describe(), "load_average": load.done(), "torch": torch.__version__,
              "command": "python benchmarks/update_rules.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "steps": args.steps, "rows": rows}
    print(tabulate([[r["model"], r["rule"], f"{r['functional_ms']:.3g}", f"{r['functional_faults']:,.0f}",
                     f"{r['in_place_ms']:.3g}", f"{r['in_place_faults']:,.0f}",
                     f"{r['functional_ms'] / r['in_place_ms']:.1f}x"] for r in rows],
                   headers=["model", "rule", "functional ms", "page faults", "in place ms", "page faults", "ratio"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
