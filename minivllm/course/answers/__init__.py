"""Answers to the questions a notebook asks before its exercise, shown only when asked for.

A notebook poses a question to answer before coding ("how many new blocks does it need?") and,
after the exercise's check, has a cell ``course.answer("nb04.new_blocks")``: the answer appears
folded under the question, and opens on a click. Its numbers are computed, by minivllm's own
parts or by the formulas the notebook teaches, never typed in. ``scripts/run_notebooks.py``
stores no output for these cells, so a notebook opened fresh never shows an answer.

Each notebook's answers are a module here, ``nbNN.py``, of functions registered with
:func:`question`, which return Markdown::

    @question("nb04.new_blocks", "How many new blocks does the request need?")
    def new_blocks() -> str:
        ...
        return f"**{n}**: ..."

A function may take keyword arguments: ``course.answer("nb02.plan", plan=out)`` passes values
the notebook computed. ``tests/course/test_answers.py`` runs every answer and checks that each one is
asked for by its notebook, and each ``course.answer`` cell names an answer that exists.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from minivllm.course.display import collapsed


@dataclass(frozen=True)
class Question:
    key: str  # "nbNN.name": the notebook's number, then a name for the question
    asked: str  # the question, in one line, as the folded answer's title
    compute: Callable[..., str]  # the answer, in Markdown


_QUESTIONS: dict[str, Question] = {}


def question(key: str, asked: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register the decorated function as the answer to ``key`` (``"nbNN.name"``)."""
    notebook, _, name = key.partition(".")
    if not (len(notebook) == 4 and notebook.startswith("nb") and notebook[2:].isdigit() and name):
        raise ValueError(f"an answer's key is 'nbNN.name', got {key!r}")

    def register(fn: Callable[..., str]) -> Callable[..., str]:
        if key in _QUESTIONS:
            raise ValueError(f"two answers for {key!r}")
        _QUESTIONS[key] = Question(key, asked, fn)
        return fn

    return register


def questions() -> dict[str, Question]:
    """Every answer of every notebook, by key."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return dict(_QUESTIONS)


def get(key: str) -> Question:
    """The question ``key`` (``"nb04.new_blocks"``); ``KeyError`` naming the notebook's others."""
    notebook = key.partition(".")[0]
    try:
        importlib.import_module(f"{__name__}.{notebook}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{notebook}":
            raise
    if key not in _QUESTIONS:
        mine = sorted(k for k in _QUESTIONS if k.startswith(notebook + "."))
        raise KeyError(f"no answer {key!r}; {notebook} has: {', '.join(mine) or 'none'}")
    return _QUESTIONS[key]


def answer(key: str, **values) -> None:
    """Show the answer to question ``key``, folded under the question until it is opened.
    ``values`` are handed to the answer's function (what the notebook computed)."""
    q = get(key)
    collapsed(f"Answer: {q.asked} (open it once you have tried)", q.compute(**values))
