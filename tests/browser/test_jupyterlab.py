"""What a student sees: notebooks opened in JupyterLab 4, in a real browser, with nothing solved.

A copy of the repository whose ``exercises/`` are the untouched stubs is served by JupyterLab
(the kernel imports the copy, ``MINIVLLM_SOLUTIONS`` unset); headless chromium opens each
notebook, which must not be marked changed on opening, must show no bare widget repr and must
open its "predict, then run" answers folded; then Run All, after which the last code cell has
run and has output, no cell shows an error, the unsolved check printed its scoreboard and the
note that the reference stands in, and the widgets drew.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from minivllm.course import exgen

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("MINIVLLM_CHROMIUM", "/usr/bin/chromium")  # the system's, never a download
NOTEBOOKS = ["00_setup_and_tour.ipynb", "02_continuous_batching.ipynb", "04_block_allocator.ipynb"]
RUN_ALL_TIMEOUT_S = 900  # one notebook, run all, on a slow shared CPU
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def student_repo(tmp_path_factory) -> Path:
    """The repository's tracked files, with exercises/ regenerated as the untouched stubs."""
    copy = tmp_path_factory.mktemp("student") / "minivllm"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    for path, text in exgen.generate_all(copy).items():
        path.write_text(text)
    return copy


@pytest.fixture(scope="module")
def lab(student_repo):
    """A JupyterLab server on the copy; yields its base URL and token."""
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("MINIVLLM_SOLUTIONS", "MINIVLLM_COURSE_ROOT")}
    env["PYTHONPATH"] = str(student_repo)  # the kernel imports the copy's package
    env["JUPYTER_CONFIG_DIR"] = str(student_repo / ".jupyter-config")  # no user settings
    log = student_repo.parent / "jupyterlab.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
         "--ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={student_repo}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=student_repo, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"JupyterLab did not start:\n{log.read_text()[-2000:]}") from None
            time.sleep(1)
    try:
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


# What the notebook model holds, read through the app JupyterLab exposes to the page.
NOTEBOOK_STATE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.model.cells;
  const out = {dirty: panel.context.model.dirty, cells: []};
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    out.cells.push({index: i, count: c.executionCount, outputs: c.outputs.toJSON()});
  }
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  out.kernel = kernel ? kernel.status : 'none';
  out.running = Array.from(document.querySelectorAll('.jp-InputPrompt')).some(e => e.textContent.includes('*'));
  return out;
}"""


def _open(page, base, token, name):
    page.goto(f"{base}/lab/tree/notebooks/{name}?token={token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                           "window.jupyterapp.shell.currentWidget.context && "
                           "window.jupyterapp.shell.currentWidget.context.isReady", timeout=120_000)
    page.wait_for_function(f"() => ({NOTEBOOK_STATE})().kernel === 'idle'", timeout=180_000)
    page.wait_for_timeout(2000)  # let the kernelspec / language_info updates land, if any


def _text(outputs) -> str:
    parts = []
    for o in outputs:
        text = o.get("text") or o.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else str(text))
    return "".join(parts)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_run_all_with_nothing_solved(name, lab, browser):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        _open(page, base, token, name)
        opened = page.evaluate(NOTEBOOK_STATE)
        assert not opened["dirty"], f"{name} is marked changed on opening"
        shown = page.locator(".jp-OutputArea-output").all_inner_texts()
        assert not [t for t in shown if t.lstrip().startswith(("VBox(", "HBox(", "interactive("))], (
            f"{name} shows a widget's bare repr before it runs")
        assert page.locator(".jp-OutputPlaceholder").count() > 0, f"{name}: no answer opens folded"

        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(f"() => {{ const s = ({NOTEBOOK_STATE})(); return s.kernel === 'idle' && !s.running && "
                               "s.cells.every(c => c.count !== null) }", timeout=RUN_ALL_TIMEOUT_S * 1000,
                               polling=2000)
        state = page.evaluate(NOTEBOOK_STATE)
        errors = [(c["index"], o.get("ename"), o.get("evalue")) for c in state["cells"]
                  for o in c["outputs"] if o.get("output_type") == "error"]
        assert not errors, f"{name}: cells that raised: {errors}"
        last = state["cells"][-1]
        assert last["count"] is not None and last["outputs"], f"{name}: the last code cell did not run to an output"
        checks = [c for c in state["cells"] if "not started:" in _text(c["outputs"])]
        assert checks and "The cells below use the reference solution" in _text(checks[0]["outputs"])
        widget_views = [o for c in state["cells"] for o in c["outputs"]
                        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        if widget_views:
            page.wait_for_timeout(3000)
            assert page.locator(".jupyter-widgets.widget-slider, .widget-slider, .widget-dropdown").count() > 0, (
                f"{name}: widget outputs, but no control drew")
    finally:
        page.close()
