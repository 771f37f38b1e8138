"""Execute course notebooks in place with the reference solutions, and time each one.

    python scripts/run_notebooks.py                      # every notebook in notebooks/
    python scripts/run_notebooks.py notebooks/02_*.ipynb # some of them
    python scripts/run_notebooks.py --check-only         # run, report times, write nothing
    python scripts/run_notebooks.py --exercises          # run on exercises/ (a student's Run All), write nothing
    python scripts/run_notebooks.py --partial-copy       # the same in a copy holding notebooks/ and exercises/ only

Outputs are stored in the notebooks so that they read well on GitHub. Runs with
``MINIVLLM_SOLUTIONS=1`` (exercise cells use ``solutions/``), in the notebooks' folder, with
this Python's kernel. Fails if a notebook raises or takes longer than ``--budget`` seconds.

What is stored is what a student should see on opening a notebook, before running anything:

- no answer: a ``course.answer(...)`` cell keeps no output (it shows the answer when run), and
  neither does a ``course.show_code(...)`` cell (your code, or a reference answer's, printed
  beside minivllm's: recorded with the reference standing in, it would be the answer);
- a cell tagged ``reveal`` (what a "predict, then run" question leads to) shows its answer
  folded: it prints inside ``with course.folded():``, whose one output is a ``<details>`` block
  that GitHub, Colab and JupyterLab all keep closed (``minivllm/course/display.py``); a reveal
  cell that does not is folded by JupyterLab's ``outputs_hidden`` alone, which the others ignore;
- no widget state, and in place of a widget's output a line saying it needs a live kernel
  (a stored widget view shows as a bare ``VBox(...)`` until its cell runs);
- the kernelspec JupyterLab itself writes, so that opening a notebook does not mark it changed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from minivllm.course.display import is_folded

ROOT = Path(__file__).resolve().parents[1]
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_PLACEHOLDER = "(interactive controls: run the cell to show them; they need a live kernel)"
ANSWER_CALL = re.compile(r"\bcourse\.(answer|show_code)\(")
CUT_SHORT = "(the rest of this cell did not run: "  # minivllm/course/go_on.py, in a partial copy


def cells_cut_short(nb) -> int:
    """How many cells of the executed ``nb`` stopped early, saying why (a partial copy)."""
    return sum(
        any(CUT_SHORT in out.get("text", "") for out in cell.get("outputs", []))
        for cell in nb.cells if cell.cell_type == "code"
    )


def partial_copy(folder: Path) -> Path:
    """A copy of the course holding ``notebooks/`` and ``exercises/`` (the stubs as shipped) alone."""
    for part in ("notebooks", "exercises"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return folder


def run(path: Path, write: bool, timeout: int) -> tuple[float, int]:
    """Execute the notebook at ``path``: (seconds, cells cut short)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    if write:
        prepare_for_students(nb)
        nbformat.write(nb, path)
    return elapsed, cells_cut_short(nb)


def prepare_for_students(nb) -> None:
    """Make the executed notebook ``nb`` open the way a student should first see it."""
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata.pop("widgets", None)  # live widget state: useless without a kernel, and large
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if ANSWER_CALL.search(cell.source):
            cell.outputs = []
        tags = cell.metadata.get("tags", [])
        if "reveal" in tags:
            jupyter = cell.metadata.setdefault("jupyter", {})
            if all(is_folded(out.get("data", {})) for out in cell.outputs):
                jupyter.pop("outputs_hidden", None)  # folded already: one click opens it
            else:
                jupyter["outputs_hidden"] = True
            if not jupyter:
                del cell.metadata["jupyter"]
        for out in cell.outputs:
            if WIDGET_VIEW in out.get("data", {}):
                out["data"] = {"text/plain": WIDGET_PLACEHOLDER}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--check-only", action="store_true", help="do not write outputs back")
    ap.add_argument("--exercises", action="store_true",
                    help="run on exercises/ as they are (untouched stubs: a student's Run All); writes nothing")
    ap.add_argument("--partial-copy", action="store_true",
                    help="run in a copy holding notebooks/ and exercises/ only (no solutions/, no benchmarks/); "
                         "writes nothing")
    ap.add_argument("--budget", type=float, default=180.0, help="seconds allowed per notebook")
    ap.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell")
    args = ap.parse_args()
    if args.exercises or args.partial_copy:
        os.environ.pop("MINIVLLM_SOLUTIONS", None)
    else:
        os.environ["MINIVLLM_SOLUTIONS"] = "1"
    write = not (args.check_only or args.exercises or args.partial_copy)
    paths = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="minivllm-course-") as scratch:
        if args.partial_copy:
            os.environ["MINIVLLM_COURSE_ROOT"] = str(partial_copy(Path(scratch)))
            paths = [Path(scratch) / "notebooks" / p.name for p in paths]
        slow = []
        for p in paths:
            elapsed, cut = run(p, write, args.timeout)
            flag = "" if elapsed <= args.budget else f"  (over the {args.budget:.0f} s budget)"
            note = f"  {cut} cell(s) cut short" if args.partial_copy or args.exercises else ""
            print(f"{p.name:<40} {elapsed:6.1f} s{note}{flag}", flush=True)
            if elapsed > args.budget:
                slow.append(p.name)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
