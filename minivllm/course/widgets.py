"""Sliders where poking beats reading -- with ipywidgets 7 (Colab) or 8 (JupyterLab 4), or none.

``interact(fn, fallback=[...], name=control, ...)`` shows ``fn``'s output under live controls
when ipywidgets is installed, and otherwise calls ``fn`` once for each fixed setting in
``fallback``, so that the plots still appear (in a plain Python kernel, or on a machine
without the notebook extras). Controls are described with the small classes below and turned
into widgets here, in the one form both ipywidgets 7 and 8 accept (keyword arguments only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Slider:
    """An integer slider from ``lo`` to ``hi``."""

    lo: int
    hi: int
    step: int = 1
    value: int | None = None

    def widget(self, w, name: str):
        value = self.lo if self.value is None else self.value
        return w.IntSlider(value=value, min=self.lo, max=self.hi, step=self.step, description=name,
                           continuous_update=False)


@dataclass(frozen=True)
class Choice:
    """One of a few options: a dropdown, or a slider over the options with ``slider=True``."""

    options: Sequence[Any]
    value: Any = None
    slider: bool = False

    def widget(self, w, name: str):
        value = self.options[0] if self.value is None else self.value
        kind = w.SelectionSlider if self.slider else w.Dropdown
        kwargs = dict(options=list(self.options), value=value, description=name)
        if self.slider:
            kwargs["continuous_update"] = False
        return kind(**kwargs)


def have_ipywidgets() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def interact(fn: Callable[..., Any], fallback: Sequence[dict] = (), **controls: Slider | Choice) -> None:
    """Live controls for ``fn(**values)`` when ipywidgets is there; else ``fn`` called with each
    dict of ``fallback`` (or once with the controls' starting values)."""
    if not have_ipywidgets():
        settings = list(fallback) or [{k: _start(c) for k, c in controls.items()}]
        print(f"(ipywidgets is not installed: {len(settings)} fixed setting(s) instead of sliders; "
              "`pip install ipywidgets` for the live version)")
        for kwargs in settings:
            fn(**kwargs)
        return None
    import ipywidgets as w

    w.interact(fn, **{name: c.widget(w, name) for name, c in controls.items()})
    return None  # the widget is displayed; nothing else for the cell to show


def _start(control: Slider | Choice) -> Any:
    if isinstance(control, Slider):
        return control.lo if control.value is None else control.value
    return control.options[0] if control.value is None else control.value
