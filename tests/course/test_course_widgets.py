"""The notebooks' sliders: the same controls with ipywidgets (7 or 8) and fixed plots without it."""

from __future__ import annotations

import pytest

from minivllm.course import widgets


def test_without_ipywidgets_each_fallback_setting_is_drawn(monkeypatch, capsys):
    monkeypatch.setattr(widgets, "have_ipywidgets", lambda: False)
    calls = []
    widgets.interact(lambda step=0, kind="a": calls.append((step, kind)),
                     fallback=[dict(step=3), dict(step=9, kind="b")],
                     step=widgets.Slider(0, 10), kind=widgets.Choice(["a", "b"]))
    assert calls == [(3, "a"), (9, "b")]
    assert "ipywidgets is not installed" in capsys.readouterr().out


def test_without_fallback_the_controls_starting_values_are_used(monkeypatch):
    monkeypatch.setattr(widgets, "have_ipywidgets", lambda: False)
    calls = []
    widgets.interact(lambda step, kind: calls.append((step, kind)),
                     step=widgets.Slider(2, 10, value=5), kind=widgets.Choice(["x", "y"], value="y", slider=True))
    assert calls == [(5, "y")]


def test_with_ipywidgets_the_controls_become_widgets():
    w = pytest.importorskip("ipywidgets")
    slider = widgets.Slider(1, 1024, 256, value=512).widget(w, "context")
    assert isinstance(slider, w.IntSlider) and (slider.min, slider.max, slider.step, slider.value) == (1, 1024, 256, 512)
    picker = widgets.Choice([256, 2048], value=2048, slider=True).widget(w, "budget")
    assert isinstance(picker, w.SelectionSlider) and picker.value == 2048
    drop = widgets.Choice(["bf16", "int4"]).widget(w, "weights")
    assert isinstance(drop, w.Dropdown) and drop.value == "bf16"
    # the widget is displayed (drawing happens in a kernel); the cell gets nothing to print
    assert widgets.interact(lambda budget: None, budget=widgets.Choice([256, 2048], value=2048, slider=True)) is None


def test_no_notebook_imports_ipywidgets_without_a_fallback():
    """docs/course.md promises fixed plots where ipywidgets is missing: a cell imports it only
    inside a guard (``if have_ipywidgets():``, ``try:``), or goes through ``widgets.interact``."""
    import ast
    import json
    from pathlib import Path

    unguarded = []
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "code":
                continue
            lines = "".join(cell["source"]).splitlines()
            code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)
            for node in ast.parse(code).body:  # the cell's top level: no guard around it
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(name.split(".")[0] == "ipywidgets" for name in names):
                    unguarded.append(f"{path.name} cell {index}")
    assert not unguarded, f"ipywidgets imported without a fallback: {unguarded}"
