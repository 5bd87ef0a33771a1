"""``make demo``: execute the quickstart notebook headless and leave a report.

Runs ``notebooks/01_quickstart.ipynb`` with nbclient (its own kernel, from the repository root so
runs land in ``data/runs``), writes the executed notebook and a standalone HTML report under
``data/runs/demo-<time>/`` and prints the summary of every run it made from the results store.

Both files are made fit to keep (:func:`slim`): the live dashboard's widget state is dropped
(each plotly ``FigureWidget`` carries the whole plotly bundle, about 5 MB, in it; the notebook's
static figures show the same data) and plotly.js is embedded once. The report is then about
plotly.js's size (5 MB) instead of 20 MB.

    python -m workbench.demo [--notebook PATH] [--out DIR] [--full]
"""
from __future__ import annotations

import argparse
import re
import sys
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


def _megabytes(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    import nbformat
    from nbclient import NotebookClient

    from .runtime.rundir import runs_root
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
