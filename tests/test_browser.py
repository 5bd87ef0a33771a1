"""The quickstart in a real browser: JupyterLab on 127.0.0.1, headless chromium, Run All,
and the dashboard must have rendered (a plotly loss plot with points, a timeline with a row per
rank). Chromium is Debian's package (``make test`` installs it with apt-get when it can);
playwright drives it through ``executable_path``: never ``playwright install``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from workbench.demo import set_parameters

CHROMIUM = "/usr/bin/chromium"
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "01_quickstart.ipynb"

pytestmark = [pytest.mark.browser, pytest.mark.mpi]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab of this test's own: it picks its port itself (``--port=0``; a port chosen here and
    taken by another process before the lab binds it made the lab move silently to the next one,
    while the test waited on, and could drive, whatever held the first) and reads it back from the
    server's info file; its runtime files, kernels' sockets (IPC: no TCP ports picked ahead and lost
    to a race), workspace, settings and IPython profile are its own (a short private folder: a
    socket's path has at most 107 bytes), shared with no other lab on the machine."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `apt-get install chromium` (make test does it as root)"
    root, state = tmp_path / "lab", Path(tempfile.mkdtemp(prefix="wb-lab-"))
    root.mkdir()
    # a copy (the lab autosaves: never touch the repository's), on 4,096 rows of each split: this test is
    # about the page (tests/test_notebooks.py runs the notebook itself on the whole data set)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    set_parameters(notebook, SUBSET=4096)
    nbformat.write(notebook, root / NOTEBOOK.name)
    token, log = "workbench-browser-test", tmp_path / "lab.log"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "JUPYTER_RUNTIME_DIR": str(state / "runtime"), "IPYTHONDIR": str(state / "ipython")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", "--port=0",
         "--ServerApp.port_retries=0", "--KernelManager.transport=ipc", f"--ServerApp.token={token}",
         f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={state / 'workspaces'}",
         f"--LabApp.user_settings_dir={state / 'settings'}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.open_browser=False", *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, cwd=root)
    deadline, url = time.monotonic() + 60, None
    while True:
        try:
            if url is None:  # written once the server listens
                url = json.loads(next((state / "runtime").glob("jpserver-*.json")).read_text())["url"].rstrip("/")
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).close()
            break
        except (OSError, StopIteration, ValueError):  # no file yet, half written, or not answering yet
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
    yield url, token, root
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(state, ignore_errors=True)


@pytest.mark.timeout(900)  # on the test: it starts a cluster and trains in the browser's kernel
def test_quickstart_runs_in_jupyterlab_and_the_dashboard_renders(lab, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
    url, token, root = lab
    shots = Path(os.environ.get("WORKBENCH_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            ready = """() => {
                const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
                return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
            }"""
            page.goto(f"{url}/lab/tree/{NOTEBOOK.name}?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            try:
                page.wait_for_function(ready, timeout=60_000)
            except PlaywrightTimeout:
                kernel = page.evaluate("""() => {
                    const w = window.jupyterapp.shell.currentWidget, s = w && w.sessionContext.session;
                    return s && s.kernel ? [s.kernel.connectionStatus, s.kernel.status] : 'no kernel';
                }""")
                pytest.fail(f"the notebook's kernel was not ready in 60 s: {kernel}\n"
                            f"{(tmp_path / 'lab.log').read_text()[-3000:]}")
            # start every cell without waiting here (the command's promise can outlive a stall)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            # done when the last cell (cluster.stop()) has an execution count and nothing is queued
            # every cell run, or one failed (Run All stops there: its traceback is the failure, at once)
            page.wait_for_function("""() => {
                const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
                    .map(p => p.textContent.trim());
                const failed = [...document.querySelectorAll(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
                    .some(o => /Traceback|Error/.test(o.textContent));
                return (prompts.length > 0 && prompts.every(t => /^\\[\\d+\\]:$/.test(t))) || failed;
            }""", timeout=300_000)
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            # textContent, not innerText: JupyterLab skips rendering cells out of view, whose innerText is empty
            tracebacks = [t for t in errors.evaluate_all("outputs => outputs.map(o => o.textContent)")
                          if "Traceback" in t or "Error" in t]
            assert not tracebacks, tracebacks
            # the live dashboard: plotly FigureWidgets rendered by the widget frontend
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 3", timeout=60_000)
            loss_points = page.evaluate("""() => {
                const plot = [...document.querySelectorAll('.js-plotly-plot')]
                    .find(p => (p.querySelector('.gtitle') || {}).textContent === 'Loss and test accuracy');
                if (!plot) return -1;
                return [...plot.querySelectorAll('.scatterlayer .trace path.js-line')]
                    .map(path => (path.getAttribute('d') || '').split(/[ML]/).length - 1)
                    .reduce((a, b) => a + b, 0);
            }""")
            assert loss_points > 10, f"loss plot has {loss_points} points"
            rows = page.evaluate("""() => {
                const plot = [...document.querySelectorAll('.js-plotly-plot')]
                    .find(p => (p.querySelector('.gtitle') || {}).textContent === 'Per-rank timeline');
                if (!plot) return null;
                return [...plot.querySelectorAll('.ytick text')].map(t => t.textContent);
            }""")
            assert rows is not None, "no timeline plot rendered"
            assert sorted(set(rows)) == ["rank 0", "rank 1", "rank 2", "rank 3"]
        finally:
            page.screenshot(path=str(shots / "quickstart-jupyterlab.png"), full_page=True)
            browser.close()
    assert (shots / "quickstart-jupyterlab.png").stat().st_size > 10_000
