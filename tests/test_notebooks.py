"""Every notebook executed as a user runs it (its own kernel, ``QUICK = True``, from its folder): a cell that
raises fails the test, and the executed notebook, made fit to keep (:func:`workbench.demo.slim`: no widget
state, plotly.js once), is written to ``build/notebooks/``, where the documentation site takes it from
(``tools/docs.py``): the site shows this run's outputs, not a second execution's. The notebooks' own
``assert`` cells are what they check."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXECUTED = ROOT / "build" / "notebooks"
#: seconds one cell may run (the longest, notebook 08's runs on a virtual cluster, take about a minute)
CELL_TIMEOUT = 600


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_runs(path: Path):
    import nbformat

    from workbench.demo import execute, slim
    notebook = nbformat.read(path, as_version=4)
    executed = EXECUTED / path.name
    executed.unlink(missing_ok=True)  # a failed run leaves none: the site never shows an older one
    execute(notebook, cwd=path.parent, timeout=CELL_TIMEOUT)  # raises CellExecutionError naming the cell
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    slim(notebook)
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, executed)
    assert sum(len(c.get("outputs", [])) for c in nbformat.read(executed, as_version=4).cells) > 0
