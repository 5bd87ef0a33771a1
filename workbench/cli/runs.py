"""``workbench runs``: the newest runs in the results store."""
from __future__ import annotations

import sys

from ..optim.registry import ALGORITHMS
from ..summary import STATUSES
from .common import open_store, percent, positive_int


def add_to(sub) -> None:
    runs = sub.add_parser("runs", help="list the runs in the results store, newest first")
    runs.add_argument("--store", metavar="FILE", help="results store (default $WORKBENCH_STORE or "
                                                      "data/workbench.sqlite)")
    runs.add_argument("--algorithm", metavar="ALGORITHM",
                      help=f"only this algorithm: {', '.join(ALGORITHMS)}, or the package.module:NAME a run gave")
    runs.add_argument("--status", choices=STATUSES, help="only runs with this status")
    runs.add_argument("--limit", type=positive_int, default=20, help="at most this many rows (default 20)")
    runs.set_defaults(func=list_runs)


def list_runs(args) -> int:
    from pathlib import Path

    import pandas as pd
    from tabulate import tabulate

    from ..store import default_path
    if args.algorithm is not None and args.algorithm not in ALGORITHMS and args.algorithm.count(":") != 1:
        print(f"workbench runs: error: --algorithm: {args.algorithm!r} is neither one of {', '.join(ALGORITHMS)} nor "
              "package.module:NAME", file=sys.stderr)
        return 2
    path = Path(args.store) if args.store else default_path()
    if not path.exists():  # listing must not create an empty store
        print(f"no runs: the results store {path} does not exist yet (workbench train creates it)")
        return 0
    store = open_store(args, "runs")
    if store is None:
        return 1
    every = store.runs(algorithm=args.algorithm, status=args.status)
    if every.empty:
        print(f"no runs in {store.path}" + (" matching the filters" if args.algorithm or args.status else ""))
        return 0

    def number(value, spec: str) -> str:
        return "" if pd.isna(value) else format(value, spec)

    shown = every.head(args.limit)
    # a run without a summary (running, or ended early): how far its live records got
    live = store.progress([r.run_id for r in shown.itertuples() if pd.isna(r.final_test_accuracy)])

    def so_far(run_id: str) -> str:
        if run_id not in live:
            return ""
        acc = live[run_id]["test_accuracy"]
        return f"step {live[run_id]['steps']}" + ("" if acc is None else f", acc {acc:.3f}")

    def status(r) -> str:  # a run that came back from faults says how often
        again = 0 if pd.isna(r.incarnations) else int(r.incarnations) - 1
        return r.status + (f" ({again} restart{'s' if again > 1 else ''})" if again else "")

    rows = [[r.run_id, f"{r.created:%Y-%m-%d %H:%M:%S}", status(r), r.algorithm, number(r.ranks, "d"),
             number(r.final_test_accuracy, ".3f"), number(r.final_loss, ".3f"), number(r.wall_seconds, ".2f"),
             percent(r.comm_fraction), so_far(r.run_id), "" if pd.isna(r.error) else r.error.splitlines()[0][:70]]
            for r in shown.itertuples()]
    print(tabulate(rows, headers=["run id", "created", "status", "algorithm", "ranks", "final test acc",
                                  "final loss", "train wall s", "comm share", "so far", "error"]))
    print(f"\n{len(rows)} of {len(every)} runs in {store.path}, newest first")
    return 0
