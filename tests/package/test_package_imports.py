"""The attention package stands on its own: a kernel module loads no engine code, and no module
of ``minivllm`` imports itself back through a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "minivllm"
KERNEL_MODULES = ["triton_env", "triton_cache", "triton_decode", "triton_prefill", "triton_kernels",
                  "triton_backend", "torch_ragged", "torch_padded", "testing"]


def test_attention_modules_load_no_engine_code():
    """Importing any attention module (a kernel, a backend, the test fixture) runs
    ``minivllm/attention/__init__.py`` and that module's imports: none of them may reach the
    scheduler, the engine's configuration or the engine."""
    imports = "; ".join(f"import minivllm.attention.{m}" for m in KERNEL_MODULES)
    code = (f"import sys; {imports}; "
            "print(sorted(m for m in sys.modules if m.startswith(('minivllm.core', 'minivllm.config', "
            "'minivllm.engine', 'minivllm.model', 'minivllm.course'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"attention modules loaded {result.stdout.strip()}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of minivllm it imports``, every import statement counted (at the top
    of the file or inside a function: a deferred import is still an edge of a circle)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {known(a.name) for a in node.names if a.name.startswith("minivllm")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                if base.startswith("minivllm"):
                    edges |= {known(f"{base}.{a.name}") for a in node.names}
        graph[name] = edges - {name}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A list of modules that import each other in a circle, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (circle := visit(start)):
            return circle
    return None


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert "minivllm.attention.triton_decode" in graph and graph["minivllm.attention.triton_backend"]
    circle = find_circle(graph)
    assert circle is None, " -> ".join(circle)


def test_the_circle_finder_finds_one():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def package_of(module: str) -> str:
    """``minivllm.engine.llm`` -> ``minivllm.engine``; a top-level module is its own package."""
    return ".".join(module.split(".")[:2])


def test_the_subpackages_import_each_other_without_a_circle():
    """Between subpackages (core, engine, sample, spec_decode, sim, ...) the imports go one way: a
    package that imports another is never imported back by it (``engine -> spec_decode ->
    engine`` was such a circle, through the sampler)."""
    packages: dict[str, set[str]] = {}
    for module, edges in import_graph().items():
        here = package_of(module)
        packages.setdefault(here, set()).update(package_of(e) for e in edges if package_of(e) != here)
    assert {"minivllm.engine", "minivllm.spec_decode", "minivllm.sample"} <= set(packages)
    circle = find_circle(packages)
    assert circle is None, " -> ".join(circle)


def test_no_module_imports_a_private_name_of_another():
    """``from minivllm.x import _name`` is how one module leans on another's insides; what a
    module offers others is public (its name has no leading underscore)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minivllm") or (
                isinstance(node, ast.ImportFrom) and node.level
            ):
                found += [f"{path.relative_to(PACKAGE.parent)}: from {node.module} import {a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert not found, found
