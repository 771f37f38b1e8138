"""The first code cell of every notebook, and the "Open in Colab" badge: written here, once.

``scripts/sync_setup_cell.py`` stamps :data:`SETUP_CELL` into every ``notebooks/NN_*.ipynb``
(as its first code cell) and points each notebook's badge at :data:`REPO_URL`;
``tests/course/test_setup_cell.py`` fails when a notebook carries anything else. Change the cell here,
then run the script.

What the cell does: on Colab it clones the repository and installs the package with its
runtime dependencies only (Colab already has torch, triton, ipywidgets and the Jupyter stack;
the notebook extras are for your own machine); everywhere it picks the device and the number
format (:mod:`minivllm.course.runtime`) and prints them.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO_URL = "https://github.com/minivllm-course/minivllm"
BRANCH = "main"
MARKER = "# Setup (the same cell in every notebook"

SETUP_CELL = f'''# NBVAL_IGNORE_OUTPUT
{MARKER}: scripts/sync_setup_cell.py writes it.)
# On Colab: fetch the course and install it with its runtime dependencies; torch, triton,
# ipywidgets and Jupyter are already there. On your own machine: nothing to install here.
import os
import subprocess
import sys

REPO_URL = "{REPO_URL}"
if "google.colab" in sys.modules:
    if not os.path.isdir("/content/minivllm"):
        subprocess.run(["git", "clone", "--depth", "1", REPO_URL, "/content/minivllm"], check=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "-e", "/content/minivllm"]
        subprocess.run(pip, check=True)
    os.chdir("/content/minivllm/notebooks")
    sys.path.insert(0, "/content/minivllm")

# Figures appear under the cell that draws them (minivllm never changes matplotlib's backend).
%matplotlib inline

import torch

import minivllm
from minivllm.course.runtime import configure, describe

# A CUDA GPU in bfloat16 (float16 on a T4, which has no bfloat16), else the CPU in float32 with
# one thread. Every LLM(...) below gets dtype=DTYPE.
DEVICE, DTYPE = configure()
print(describe(DEVICE, DTYPE))'''

_BADGE_PREFIX = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]("


def badge(notebook_name: str) -> str:
    """The markdown of the notebook's "Open in Colab" badge."""
    repo = REPO_URL.removeprefix("https://github.com/")
    return f"{_BADGE_PREFIX}https://colab.research.google.com/github/{repo}/blob/{BRANCH}/notebooks/{notebook_name})"


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _set_source(cell: dict, text: str) -> None:
    lines = text.split("\n")
    cell["source"] = [line + "\n" for line in lines[:-1]] + [lines[-1]]


def sync_notebook(path: Path, write: bool = True) -> list[str]:
    """Make the notebook's first code cell :data:`SETUP_CELL` and its badge :func:`badge`.
    Returns what differed (nothing: already in sync). Outputs of a rewritten setup cell are
    cleared, since they came from the old code."""
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    changes = []
    code = [c for c in cells if c["cell_type"] == "code"]
    if not code:
        raise ValueError(f"{path.name} has no code cell to hold the setup")
    setup = code[0]
    if _source(setup) != SETUP_CELL:
        changes.append("setup cell")
        _set_source(setup, SETUP_CELL)
        setup["outputs"], setup["execution_count"] = [], None
    first_md = next((c for c in cells if c["cell_type"] == "markdown"), None)
    if first_md is not None:
        text = _source(first_md)
        wanted = badge(path.name)
        lines = text.split("\n")
        at = [i for i, line in enumerate(lines) if line.startswith(_BADGE_PREFIX)]
        if not at:
            changes.append("badge missing")
            lines[1:1] = ["", wanted]
        elif lines[at[0]] != wanted:
            changes.append("badge link")
            lines[at[0]] = wanted
        _set_source(first_md, "\n".join(lines))
    if changes and write:
        path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")  # as nbformat writes
    return changes
