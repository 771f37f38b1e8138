"""Execute course notebooks in place with the reference solutions, and time each one.

    python scripts/run_notebooks.py                      # every notebook in notebooks/
    python scripts/run_notebooks.py notebooks/02_*.ipynb # some of them
    python scripts/run_notebooks.py --check-only         # run, report times, write nothing

Outputs are stored in the notebooks so that they read well on GitHub. Runs with
``MINIVLLM_SOLUTIONS=1`` (exercise cells use ``solutions/``), in the notebooks' folder, with
this Python's kernel. Fails if a notebook raises or takes longer than ``--budget`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def run(path: Path, write: bool, timeout: int) -> float:
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
        nb.metadata.pop("widgets", None)  # live widget state: useless without a kernel, and large
        nbformat.write(nb, path)
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--check-only", action="store_true", help="do not write outputs back")
    ap.add_argument("--budget", type=float, default=180.0, help="seconds allowed per notebook")
    ap.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell")
    args = ap.parse_args()
    os.environ["MINIVLLM_SOLUTIONS"] = "1"
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    slow = []
    for p in paths:
        elapsed = run(p.resolve(), not args.check_only, args.timeout)
        flag = "" if elapsed <= args.budget else f"  (over the {args.budget:.0f} s budget)"
        print(f"{p.name:<40} {elapsed:6.1f} s{flag}", flush=True)
        if elapsed > args.budget:
            slow.append(p.name)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
