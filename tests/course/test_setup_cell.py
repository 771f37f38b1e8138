"""Every notebook opens with the same setup cell and a Colab badge that points at the
repository: both come from ``minivllm/course/setup_cell.py`` (``scripts/sync_setup_cell.py``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm.course import setup_cell

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_carries_the_canonical_setup_cell_and_badge(path):
    assert setup_cell.sync_notebook(path, write=False) == [], (
        f"{path.name} differs from minivllm/course/setup_cell.py: run python scripts/sync_setup_cell.py"
    )


def test_setup_cell_installs_from_the_one_repository_url():
    cell = setup_cell.SETUP_CELL
    assert cell.count(setup_cell.REPO_URL) == 1 and cell.count("github.com") == 1
    assert "# NBVAL_IGNORE_OUTPUT" == cell.splitlines()[0]
    # runtime dependencies only: no extras on Colab, and nothing that upgrades torch or ipywidgets
    install = re.search(r'"pip", "install", (.*)\]', cell).group(1)
    assert "[" not in install and "ipywidgets" not in install and "torch" not in install
    repo = setup_cell.REPO_URL.removeprefix("https://github.com/")
    assert f"/github/{repo}/blob/" in setup_cell.badge("00_setup_and_tour.ipynb")


def test_sync_rewrites_a_stale_notebook_and_clears_its_output(tmp_path):
    path = tmp_path / "99_demo.ipynb"
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# 99 · Demo\n", "\n", "Text."]},
            {"cell_type": "code", "metadata": {}, "execution_count": 3, "source": ["print('old setup')"],
             "outputs": [{"output_type": "stream", "name": "stdout", "text": ["old setup\n"]}]},
            {"cell_type": "code", "metadata": {}, "execution_count": 4, "source": ["x = 1"], "outputs": []},
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    assert setup_cell.sync_notebook(path) == ["setup cell", "badge missing"]
    assert setup_cell.sync_notebook(path) == []  # idempotent
    cells = json.loads(path.read_text())["cells"]
    assert "".join(cells[1]["source"]) == setup_cell.SETUP_CELL and cells[1]["outputs"] == []
    assert setup_cell.badge("99_demo.ipynb") in "".join(cells[0]["source"])
    assert "".join(cells[2]["source"]) == "x = 1"  # the notebook's own cells are untouched


def test_sync_script_check_mode(tmp_path):
    copy = tmp_path / NOTEBOOKS[0].name
    shutil.copy(NOTEBOOKS[0], copy)
    script = ROOT / "scripts" / "sync_setup_cell.py"
    ok = subprocess.run([sys.executable, str(script), "--check", str(copy)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    nb = json.loads(copy.read_text())
    next(c for c in nb["cells"] if c["cell_type"] == "code")["source"] = ["import os"]
    copy.write_text(json.dumps(nb))
    stale = subprocess.run([sys.executable, str(script), "--check", str(copy)], capture_output=True, text=True)
    assert stale.returncode == 1 and "differs (setup cell)" in stale.stdout
