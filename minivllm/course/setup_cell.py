"""The first code cell of every notebook, and the "Open in Colab" badge: written here, once.

``scripts/sync_setup_cell.py`` stamps :data:`SETUP_CELL` into every ``notebooks/NN_*.ipynb``
(as its first code cell) and points each notebook's badge at :data:`REPO_URL`;
``tests/course/test_setup_cell.py`` fails when a notebook carries anything else. Change the cell here,
then run the script.

What the cell does: on Colab it fetches the course at :data:`RELEASE` (the release these
notebooks were written for, not whatever the default branch holds that day), installs the
package with its runtime dependencies only (Colab already has torch, triton, ipywidgets and the
Jupyter stack; the notebook extras are for your own machine), and keeps the student's
``exercises/`` where a recycled runtime does not lose it (:mod:`minivllm.course.colab`: on Google
Drive, or saved and restored by hand with ``KEEP_WORK_ON_DRIVE = False``); everywhere it picks
the device and the number format (:mod:`minivllm.course.runtime`) and prints them.

Whoever publishes the course sets :data:`REPO_URL` to the repository's address, tags each release
``v<version>`` (the package's version, ``pyproject.toml``), and runs the script: the cells and
the badges then point there.
"""

from __future__ import annotations

import json
from pathlib import Path

import minivllm

REPO_URL = "https://github.com/minivllm-course/minivllm"  # where the course is published
RELEASE = f"v{minivllm.__version__}"  # the git tag a Colab session installs
BRANCH = "main"  # what the badges open
MARKER = "# Setup (the same cell in every notebook"

SETUP_CELL = f'''# NBVAL_IGNORE_OUTPUT
{MARKER}: scripts/sync_setup_cell.py writes it.)
# On Colab: fetch the course's release, install it with its runtime dependencies (torch, triton,
# ipywidgets and Jupyter are already there), and keep your exercises/ on Google Drive, where a
# recycled runtime does not lose them. On your own machine: nothing to install here.
import os
import subprocess
import sys

REPO_URL = "{REPO_URL}"
RELEASE = "{RELEASE}"
KEEP_WORK_ON_DRIVE = True  # exercises/ on Google Drive; False: save_work() / restore_work() by hand
if "google.colab" in sys.modules:
    content = os.environ.get("MINIVLLM_COLAB_CONTENT", "/content")
    course_dir = os.path.join(content, "minivllm")
    if not os.path.isdir(course_dir):
        clone = ["git", "clone", "--quiet", "--depth", "1"]
        if subprocess.run([*clone, "--branch", RELEASE, REPO_URL, course_dir]).returncode != 0:
            print(f"release {{RELEASE}} is not at {{REPO_URL}}: taking its default branch instead")
            subprocess.run([*clone, REPO_URL, course_dir], check=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "-e", course_dir]
        subprocess.run(pip, check=True)
    sys.path.insert(0, course_dir)
    os.chdir(os.path.join(course_dir, "notebooks"))
    from minivllm.course.colab import keep_work

    work_dir = os.path.join(content, "drive", "MyDrive", "minivllm-work")
    keep_work(course_dir, work_dir if KEEP_WORK_ON_DRIVE else None)

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
