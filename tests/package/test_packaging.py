"""The conda environment and pyproject describe the same dependencies; the CLI entry exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[<>=!~; \[]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {r.replace(" ", "") for r in project["dependencies"] + [r for e in extras.values() for r in e]}
    pip_section = re.search(r"- pip:\n((?:\s+- .*\n)+)", (ROOT / "environment.yml").read_text()).group(1)
    listed = {line.strip()[2:].replace(" ", "") for line in pip_section.splitlines()}
    listed.discard("-e.")
    assert {_name(r) for r in listed} == {_name(r) for r in wanted}
    assert listed == wanted, f"version pins differ: {sorted(listed ^ wanted)}"


def test_runtime_dependencies_leave_colab_alone_and_dev_installs_everything():
    """Colab installs the runtime dependencies only (it has torch, triton, ipywidgets 7 and
    Jupyter); the README's `pip install -e ".[dev]"` must still bring what the tests use."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    assert not runtime & {"ipywidgets", "jupyterlab", "nbval", "pytest", "hypothesis", "notebook"}
    extras = project["optional-dependencies"]
    assert set(extras["notebooks"]) <= set(extras["dev"])
    assert {"pytest", "hypothesis", "nbval", "ipywidgets", "ruff"} <= {_name(r) for r in extras["dev"]}
    widgets = next(r for r in extras["notebooks"] if _name(r) == "ipywidgets")
    assert widgets.replace(" ", "") == "ipywidgets>=7.6", "Colab ships ipywidgets 7: do not require 8"


def test_python_range_agrees():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # no upper bound: pip picks the torch and Triton wheels for the interpreter it runs under
    assert project["requires-python"] == ">=3.10"
    assert "  - python>=3.10\n" in (ROOT / "environment.yml").read_text()


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


def _imported_modules(code: str) -> set[str]:
    """The top-level modules ``code`` needs: its absolute imports, except those in a ``try``
    that catches ``ImportError`` (an optional package); IPython magics skipped."""
    import ast

    lines = ("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())
    found: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse("\n".join(lines)))
    return found


def test_the_notebooks_extra_brings_what_the_notebooks_import():
    """The README says `pip install -e ".[notebooks]"` is enough to work through the notebooks:
    every package their code cells (and the benchmark scripts they load) import comes with the
    runtime dependencies or that extra."""
    import json

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["notebooks"]}
    # module -> the distribution that brings it, where the names differ
    brought_by = {"IPython": "jupyterlab", "yaml": "transformers"}
    imported: dict[str, set[str]] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for module in _imported_modules(code):
            imported.setdefault(module, set()).add(path.name)
        for name in re.findall(r'load_benchmark\("(\w+)"\)', code):
            for module in _imported_modules((ROOT / "benchmarks" / f"{name}.py").read_text()):
                imported.setdefault(module, set()).add(f"benchmarks/{name}.py")
    local = {"minivllm"} | {p.stem for folder in ("benchmarks", "scripts") for p in (ROOT / folder).glob("*.py")}
    missing = {m: sorted(where) for m, where in imported.items()
               if m not in sys.stdlib_module_names and m not in local
               and brought_by.get(m, m).lower().replace("_", "-") not in installed}
    assert not missing, f"imported by the notebooks, not in the runtime dependencies or [notebooks]: {missing}"
