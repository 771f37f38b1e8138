"""Stamp the canonical setup cell and Colab badge into every notebook.

    python scripts/sync_setup_cell.py            # rewrite the notebooks that differ
    python scripts/sync_setup_cell.py --check    # exit 1 if any notebook differs (CI, tests)
    python scripts/sync_setup_cell.py notebooks/04_*.ipynb

The cell and the repository URL live in ``minivllm/course/setup_cell.py``. A notebook's first
code cell is its setup cell; code a notebook needs beyond it (``import triton``, say) belongs in
the next cell. A rewritten setup cell loses its stored output: re-run the notebook
(``python scripts/run_notebooks.py ...``) to store a fresh one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minivllm.course.setup_cell import sync_notebook  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a notebook differs")
    args = ap.parse_args()
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    stale = 0
    for path in paths:
        changes = sync_notebook(path, write=not args.check)
        if changes:
            stale += 1
            verb = "differs" if args.check else "rewritten"
            print(f"{path.name}: {verb} ({', '.join(changes)})")
    if not stale:
        print(f"{len(paths)} notebook(s) carry the canonical setup cell")
    return 1 if (stale and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
