"""``make demo``: execute the quickstart notebook headless and leave a report.

Brings up a virtual cluster of 4 nodes on a switch with shaped links (``--link``, default
100 Mbit/s; :mod:`workbench.vcluster`) when it can (as root, or rootless where user namespaces are
allowed), else says why in one line and trains on this host; runs ``notebooks/01_quickstart.ipynb``
(Fashion-MNIST) with nbclient on it (its own kernel, from the repository root so runs land in
``data/runs``), writes the executed notebook and a standalone HTML report under
``data/runs/demo-<time>/``, prints the summary of every run it made from the results store, and
takes the cluster down.

Both files are made fit to keep (:func:`slim`): the live dashboard's widget state is dropped
(each plotly ``FigureWidget`` carries the whole plotly bundle, about 5 MB, in it; the notebook's
static figures show the same data) and plotly.js is embedded once. The report is then about
plotly.js's size (5 MB) instead of 20 MB.

    python -m workbench.demo [--notebook PATH] [--out DIR] [--full] [--dataset NAME] [--link RATE | --no-vcluster]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

WIDGET_STATE = "widgets"  # notebook metadata key holding every widget model's state
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: The plotly.js bundle as ``plotly.io.to_html(include_plotlyjs=True)`` embeds it (its licence header first).
PLOTLYJS = re.compile(r"<script[^>]*>\s*/\*\*\s*\*\s*plotly\.js v\d.*?</script>", re.S)
WIDGET_NOTE = ("(a live widget: its state is not kept in the saved notebook and report; "
               "the static figures show the same data)")


def slim(notebook) -> dict[str, int]:
    """Make an executed notebook fit to keep and share, in place; returns what went.

    - ``metadata.widgets`` (the widgets' state) is removed: a plotly ``FigureWidget`` stores the
      whole plotly bundle in it, once per widget;
    - each widget view output (which cannot be drawn without that state) becomes a line of text;
    - plotly.js stays in the first HTML output that embeds it and is removed from later ones:
      the bundle defines ``window.Plotly``, which every later figure on the page uses.
    """
    stats = {"widget_state_chars": len(str(notebook.metadata.get(WIDGET_STATE, ""))), "widget_views": 0,
             "plotlyjs_removed": 0}
    notebook.metadata.pop(WIDGET_STATE, None)
    seen_plotlyjs = False
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data")
            if not data:
                continue
            if WIDGET_VIEW in data:
                output["data"] = {"text/plain": WIDGET_NOTE}
                stats["widget_views"] += 1
                continue
            html = data.get("text/html")
            if html is None:
                continue
            html = "".join(html) if isinstance(html, list) else html

            def keep_first(match: re.Match) -> str:
                nonlocal seen_plotlyjs
                if not seen_plotlyjs:
                    seen_plotlyjs = True
                    return match.group(0)
                stats["plotlyjs_removed"] += 1
                return ""
            data["text/html"] = PLOTLYJS.sub(keep_first, html)
    return stats


def export(notebook, out: Path, stem: str) -> tuple[Path, Path]:
    """:func:`slim` the executed ``notebook``, then write it and its HTML report to ``out``."""
    import nbformat
    from nbconvert import HTMLExporter

    slim(notebook)
    executed = out / f"{stem}.ipynb"
    nbformat.write(notebook, executed)
    html, _ = HTMLExporter().from_notebook_node(notebook)
    report = out / f"{stem}.html"
    report.write_text(html, encoding="utf-8")
    return executed, report


#: the demo's virtual cluster: 4 nodes (one rank each) on a switch
DEMO_NODES = 4


def virtual_cluster(link: str):
    """``(cluster, None)``: a virtual cluster of :data:`DEMO_NODES` nodes on a switch at ``link``,
    up; or ``(None, reason)`` in one line when one cannot be made here."""
    import os

    from .vcluster import PlanError, VirtualCluster, VirtualClusterError
    try:  # a name of at most 8 characters: it goes into interface names
        vc = VirtualCluster(f"dm{os.getpid() % 1_000_000}", nodes=DEMO_NODES, topology="switch", bandwidth=link)
        vc.up()
    except (PlanError, VirtualClusterError, OSError) as exc:  # up() removes what it made
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return vc, None


def set_parameters(notebook, **values) -> None:
    """Set ``NAME = value`` lines of the notebook's ``parameters`` cell (papermill's convention)."""
    for cell in notebook.cells:
        if "parameters" not in cell.get("metadata", {}).get("tags", []):
            continue
        lines = cell.source.splitlines()
        for name, value in values.items():
            lines = [f"{name} = {value!r}" if line.split("=")[0].strip() == name else line for line in lines]
        cell.source = "\n".join(lines)


def parameter(notebook, name: str):
    """The value of ``NAME = value`` in the notebook's ``parameters`` cell (a Python literal), or None."""
    import ast
    for cell in notebook.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                    try:
                        return ast.literal_eval(node.value)
                    except ValueError:
                        return None
    return None


def check_dataset(name: str) -> str | None:
    """None if the data set ``name`` can be read here, else why not in one line (before anything starts)."""
    from .data import describe
    try:
        describe(name)
    except (ValueError, OSError) as exc:
        return (f"{str(exc).strip().splitlines()[0]}; or give the demo a copy of it: "
                "make demo DEMO_ARGS='--dataset idx:FOLDER' (a folder of its four IDX files)")
    return None


def _megabytes(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def execute(notebook, cwd: str | os.PathLike | None = None, timeout: float = 900) -> None:
    """Run every cell of ``notebook`` (in place: its outputs filled in) in a kernel whose sockets are Unix sockets
    in a 0700 folder (no other user of the machine reaches it), in ``cwd`` (default this directory), each cell
    within ``timeout`` seconds, then shut the kernel down. A cell that raises raises nbclient's
    ``CellExecutionError``, naming the cell."""
    from jupyter_client import KernelManager
    from nbclient import NotebookClient
    with tempfile.TemporaryDirectory(prefix="wb-kernel-") as sockets:
        kernel = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "k"))
        try:
            NotebookClient(notebook, km=kernel, timeout=timeout,
                           resources={"metadata": {"path": str(cwd or Path.cwd())}}).execute()
        finally:
            if kernel.has_kernel:
                kernel.shutdown_kernel()


def main(argv: list[str] | None = None) -> int:
    import nbformat

    from .runtime.rundir import runs_root
    from .store import Store

    parser = argparse.ArgumentParser(prog="workbench.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebook", default="notebooks/01_quickstart.ipynb")
    parser.add_argument("--out", help="output directory (default data/runs/demo-<time>)")
    parser.add_argument("--full", action="store_true", help="QUICK = False: the longer run")
    parser.add_argument("--dataset", help="the notebook's DATASET (default its own: fashion-mnist); idx:FOLDER "
                                          "for a copy of Fashion-MNIST's four IDX files in FOLDER")
    parser.add_argument("--link", default="100mbit", help="link rate of the virtual cluster (default 100mbit)")
    parser.add_argument("--no-vcluster", dest="vcluster", action="store_false",
                        help="train on this host (shared memory), no virtual cluster")
    args = parser.parse_args(argv)
    out = Path(args.out or runs_root() / f"demo-{datetime.now():%Y%m%d-%H%M%S}")
    notebook = nbformat.read(args.notebook, as_version=4)
    if args.full:
        set_parameters(notebook, QUICK=False)
    if args.dataset:
        set_parameters(notebook, DATASET=args.dataset)
    dataset = parameter(notebook, "DATASET")
    why_not = check_dataset(dataset) if isinstance(dataset, str) else None
    if why_not:
        print(f"workbench.demo: {why_not}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    vc, why = virtual_cluster(args.link) if args.vcluster else (None, "--no-vcluster")
    if vc is not None:
        link = f"a virtual cluster's {args.link} links ({DEMO_NODES} nodes on a switch, one rank each)"
        set_parameters(notebook, VCLUSTER=vc.name, LINK=link)
        print(f"virtual cluster {vc.name}: {DEMO_NODES} nodes on a switch at {args.link}", flush=True)
    else:
        print(f"no virtual cluster ({why}); training on this host", flush=True)
    print(f"executing {args.notebook} ...", flush=True)
    try:
        execute(notebook)
    finally:
        if vc is not None:
            vc.down()
    executed, report = export(notebook, out, Path(args.notebook).stem)
    print(f"executed notebook: {executed} ({_megabytes(executed)})\n"
          f"HTML report:       {report} ({_megabytes(report)})")
    runs = Store().runs()
    mine = runs[runs["created"] >= datetime.fromtimestamp(started - 1)].iloc[::-1]  # oldest first
    for _, row in mine.iterrows():
        print(f"run {row['run_id']}: {row['algorithm']} ({row.get('model', '?')}) on {row['ranks']} ranks, "
              f"status {row['status']}, final test accuracy {row['final_test_accuracy']:.3f}, "
              f"training {row['wall_seconds']:.2f} s, communication share {row['comm_fraction']:.0%}\n"
              f"  files: {row['run_dir']}")
    print(f"demo: {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
