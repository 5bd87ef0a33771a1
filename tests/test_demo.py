"""``make demo``'s files: the executed notebook and its HTML report carry plotly.js once and no
widget state (the live dashboard's FigureWidgets each put the whole plotly bundle there).

The executed notebook is built here as nbclient leaves it, without a kernel (a kernel that makes
a FigureWidget spends seconds importing): three FigureWidgets like the dashboard's, their state
in ``metadata.widgets`` (``ipywidgets.embed``'s format, which nbclient stores too) and their
views as outputs, then two static figures that each embed plotly.js, as ``show_static`` does.
"""
from __future__ import annotations

import nbformat
import plotly.graph_objects as go
import plotly.io as pio
from ipywidgets.embed import embed_data
from plotly.offline import get_plotlyjs

from workbench.demo import WIDGET_NOTE, WIDGET_VIEW, export


def _executed_notebook():
    new = nbformat.v4
    live = [go.FigureWidget(data=[go.Scatter(y=[1, 3, 2])], layout=dict(title=dict(text=f"live {i}")))
            for i in range(3)]
    embedded = embed_data(views=live, drop_defaults=False)  # all of it, as the kernel sends it
    views = [new.new_output("display_data", data={WIDGET_VIEW: spec, "text/plain": repr(widget)})
             for spec, widget in zip(embedded["view_specs"], live)]
    statics = [new.new_output("display_data", data={"text/html": pio.to_html(
        go.Figure(go.Bar(y=[1, 2]), layout=dict(title=dict(text=title))), full_html=False,
        include_plotlyjs=True), "text/plain": "<IPython.core.display.HTML object>"})
        for title in ("static one", "static two")]
    notebook = new.new_notebook(cells=[new.new_code_cell("dashboard", outputs=views, execution_count=1),
                                       new.new_code_cell("dashboard.show_static()", outputs=statics,
                                                         execution_count=2)])
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": embedded["manager_state"]}
    for widget in live:
        widget.close()
    return notebook


def test_the_report_embeds_plotlyjs_once_and_no_widget_state(tmp_path):
    notebook = _executed_notebook()
    bundle = len(get_plotlyjs())
    assert len(nbformat.writes(notebook)) > 4 * bundle  # what the demo used to save: ~5 MB per widget
    executed, report = export(notebook, tmp_path, "small")
    assert report.stat().st_size < bundle + 1_000_000  # plotly.js once and little else
    assert executed.stat().st_size < bundle + 1_000_000
    html = report.read_text(encoding="utf-8")
    assert html.count("plotly.js v") == 1
    assert html.count("Plotly.newPlot") == 2 and "static one" in html and "static two" in html
    saved = nbformat.read(executed, as_version=4)
    nbformat.validate(saved)
    assert "widgets" not in saved.metadata
    assert [o.data for o in saved.cells[0].outputs] == [{"text/plain": WIDGET_NOTE}] * 3
    assert [o.data["text/html"].count("plotly.js v") for o in saved.cells[1].outputs] == [1, 0]


def test_the_demo_sets_the_notebooks_parameters():
    from workbench.demo import set_parameters
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("QUICK = True\nEPOCHS = 1 if QUICK else 5\nVCLUSTER = None  # a name\nLINK = 'memory'",
                                  metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("VCLUSTER = None")])
    set_parameters(notebook, QUICK=False, VCLUSTER="demo7", LINK="100mbit links")
    assert notebook.cells[0].source.splitlines() == ["QUICK = False", "EPOCHS = 1 if QUICK else 5", "VCLUSTER = 'demo7'",
                                                     "LINK = '100mbit links'"]
    assert notebook.cells[1].source == "VCLUSTER = None"  # only the parameters cell


def test_the_quickstart_takes_a_virtual_cluster_and_names_its_link():
    """make demo runs notebook 01 on a virtual cluster through these two parameters."""
    notebook = nbformat.read("notebooks/01_quickstart.ipynb", as_version=4)
    parameters = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    assert "VCLUSTER = None" in parameters.source and "DATASET = \"fashion-mnist\"" in parameters.source
    assert any("wb.Cluster(n=RANKS, vcluster=VCLUSTER)" in c.source for c in notebook.cells)


def test_a_virtual_cluster_that_cannot_be_made_is_one_line_and_no_cluster():
    from workbench.demo import virtual_cluster
    vc, why = virtual_cluster("fast")  # not a rate: refused before anything is made
    assert vc is None and why.startswith("PlanError: ") and "bandwidth" in why and "\n" not in why


def test_a_data_set_that_is_not_here_stops_the_demo_in_one_line_before_anything_starts(tmp_path):
    """Where Fashion-MNIST is missing and cannot be installed, ``make demo`` names the fix at once (it
    used to fail 51 s in, at the notebook's first cell); ``--dataset idx:FOLDER`` points it at a copy."""
    import subprocess
    import sys
    import time
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "workbench.demo", "--dataset", f"idx:{tmp_path / 'absent'}",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("workbench.demo: dataset ")
    assert str(tmp_path / "absent") in out.stderr and "--dataset idx:FOLDER" in out.stderr
    assert "virtual cluster" not in out.stdout and "executing" not in out.stdout  # nothing started
    assert not (tmp_path / "out").exists()
    assert time.monotonic() - started < 60


def test_the_demo_reads_the_notebooks_data_set():
    from workbench.demo import parameter
    notebook = nbformat.read("notebooks/01_quickstart.ipynb", as_version=4)
    assert parameter(notebook, "DATASET") == "fashion-mnist" and parameter(notebook, "RANKS") == 4
    assert parameter(notebook, "NO_SUCH_NAME") is None
