"""Repository-wide pytest settings for the course.

- ``--solutions`` grades ``solutions/`` instead of ``exercises/`` (same as setting
  ``MINIVLLM_SOLUTIONS=1``; notebook kernels started by nbval inherit it).
- ``exNN`` markers are registered for every ``solutions/exNN_*.py`` (``pytest -m ex02``).
- Notebooks run under nbval use this Python environment's kernel unless ``--nbval-kernel-name``
  is given, so a virtual environment or conda env needs no registered Jupyter kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def pytest_addoption(parser):
    parser.addoption(
        "--solutions",
        action="store_true",
        default=False,
        help="grade the reference solutions/ instead of exercises/ (sets MINIVLLM_SOLUTIONS=1)",
    )


def pytest_configure(config):
    if config.getoption("--solutions"):
        os.environ["MINIVLLM_SOLUTIONS"] = "1"
    for path in sorted((ROOT / "solutions").glob("ex[0-9][0-9]_*.py")):
        short = path.stem.split("_")[0]
        config.addinivalue_line("markers", f"{short}: exercise {path.stem}")
    opt = config.option
    if getattr(opt, "nbval", False) or getattr(opt, "nbval_lax", False):
        if not getattr(opt, "nbval_kernel_name", None) and not getattr(opt, "current_env", False):
            opt.nbval_current_env = True
