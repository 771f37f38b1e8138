"""The conda environment and pyproject describe the same dependencies; the CLI entry exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~; \[]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {r.replace(" ", "") for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    pip_section = re.search(r"- pip:\n((?:\s+- .*\n)+)", (ROOT / "environment.yml").read_text()).group(1)
    listed = {line.strip()[2:].replace(" ", "") for line in pip_section.splitlines()}
    listed.discard("-e.")
    assert {_name(r) for r in listed} == {_name(r) for r in wanted}
    assert listed == wanted, f"version pins differ: {sorted(listed ^ wanted)}"


def test_python_range_agrees():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10,<3.13"
    assert "python>=3.10,<3.13" in (ROOT / "environment.yml").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"```bash\n# run the tests\n(.+)\n", readme).group(1).strip()
    assert command in ci
    assert ci.index("pip install torch==2.13.0") < ci.index('pip install -e ".[dev]"')


def test_cli_generate_prints_text():
    out = subprocess.run(
        [sys.executable, "-m", "minivllm.cli", "generate", "Once upon a time", "--max-tokens", "20"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert len(out.split()) >= 5, out
