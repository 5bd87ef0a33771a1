"""The quickstart in a real browser: JupyterLab on 127.0.0.1, headless chromium, Run All,
and the dashboard must have rendered (a plotly loss plot with points, a timeline with a row per
rank). Chromium is Debian's package (``make test`` installs it with apt-get when it can);
playwright drives it through ``executable_path``: never ``playwright install``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from workbench.runtime.launch.ports import free_port

CHROMIUM = "/usr/bin/chromium"
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "01_quickstart.ipynb"

pytestmark = [pytest.mark.browser, pytest.mark.mpi]


@pytest.fixture
def lab(tmp_path):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `apt-get install chromium` (make test does it as root)"
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)  # the lab autosaves: never touch the repository's copy
    port, token = free_port(), "workbench-browser-test"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.open_browser=False", *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=open(tmp_path / "lab.log", "w"), stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
            time.sleep(0.3)
    yield url, token, root
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()


def _restart_kernels(url: str, token: str) -> None:
    import json
    with urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=10) as response:
        kernels = json.load(response)
    for kernel in kernels:
        request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}/restart?token={token}", method="POST")
        urllib.request.urlopen(request, timeout=60).close()


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
            for attempt in range(3):  # now and then the first kernel connection stalls on a loaded machine
                page.goto(f"{url}/lab/tree/{NOTEBOOK.name}?token={token}")
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
                try:
                    page.wait_for_function(ready, timeout=60_000)
                    break
                except PlaywrightTimeout:
                    if attempt == 2:
                        raise
                    _restart_kernels(url, token)
            # start every cell without waiting here (the command's promise can outlive a stall)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            # done when the last cell (cluster.stop()) has an execution count and nothing is queued
            page.wait_for_function("""() => {
                const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
                    .map(p => p.textContent.trim());
                return prompts.length > 0 && prompts.every(t => /^\\[\\d+\\]:$/.test(t));
            }""", timeout=300_000)
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
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
