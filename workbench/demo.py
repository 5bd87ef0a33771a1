"""``make demo``: execute the quickstart notebook headless and leave a report.

Runs ``notebooks/01_quickstart.ipynb`` with nbclient (its own kernel, from the repository root so
runs land in ``data/runs``), writes the executed notebook and a standalone HTML report under
``data/runs/demo-<time>/`` and prints the run's summary from the results store.

    python -m workbench.demo [--notebook PATH] [--out DIR] [--full]
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    from .runtime.batch import runs_root
    from .store import Store

    parser = argparse.ArgumentParser(prog="workbench.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebook", default="notebooks/01_quickstart.ipynb")
    parser.add_argument("--out", help="output directory (default data/runs/demo-<time>)")
    parser.add_argument("--full", action="store_true", help="QUICK = False: the longer run")
    args = parser.parse_args(argv)
    out = Path(args.out or runs_root() / f"demo-{datetime.now():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    notebook = nbformat.read(args.notebook, as_version=4)
    if args.full:
        for cell in notebook.cells:
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                cell.source = cell.source.replace("QUICK = True", "QUICK = False")
    started = time.time()
    print(f"executing {args.notebook} ...", flush=True)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(Path.cwd())}}).execute()
    executed = out / Path(args.notebook).name
    nbformat.write(notebook, executed)
    html, _ = HTMLExporter().from_notebook_node(notebook)
    report = out / (Path(args.notebook).stem + ".html")
    report.write_text(html)
    runs = Store().runs()
    newest = runs[runs["created"] >= datetime.fromtimestamp(started - 1)].head(1)
    print(f"executed notebook: {executed}\nHTML report:       {report}")
    if not newest.empty:
        row = newest.iloc[0]
        print(f"run {row['run_id']}: {row['algorithm']} on {row['ranks']} ranks, status {row['status']}, "
              f"final test accuracy {row['final_test_accuracy']:.3f}, training {row['wall_seconds']:.2f} s, "
              f"communication share {row['comm_fraction']:.0%}\n  files: {row['run_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
