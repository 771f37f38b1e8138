"""What every exercise's grader shares: the exercise a module grades is its ``NAME``; the
``ex`` fixture is that exercise, loaded as ``course.load`` loads it (``exercises/``, your work, or
``solutions/`` with ``MINIVLLM_SOLUTIONS=1`` or ``--solutions``); and every test of the module
carries the exercise's marker (``pytest -m ex04``; the root ``conftest.py`` declares one per
solution file). The notebook's cases of every exercise run in ``test_cases.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from minivllm import course


def marker(name: str) -> pytest.MarkDecorator:
    """``ex04_block_allocator`` -> ``pytest.mark.ex04``."""
    return getattr(pytest.mark, name.split("_")[0])


@pytest.fixture(scope="module")
def ex(request):
    return course.load(request.module.NAME)


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items) -> None:
    """Called with every item of the session (notebook cells too): mark this folder's."""
    for item in items:
        if Path(item.fspath).resolve().parent == HERE:
            name = getattr(getattr(item, "module", None), "NAME", None)
            if name is not None:
                item.add_marker(marker(name))
