"""Answers to the questions the notebooks ask before their exercises: every one runs and says
something, folded in a notebook, and a wrong key is named (notebooks ask for existing keys:
tests/course/test_notebook_cells.py)."""

from __future__ import annotations

import inspect

import pytest

from minivllm import course
from minivllm.course import answers

QUESTIONS = answers.questions()


def test_there_is_an_answer_per_notebook_that_asks_a_question():
    assert {key.split(".")[0] for key in QUESTIONS} >= {f"nb{n:02d}" for n in (0, 1, 2, 3, 4, 5, 7, 8, 9)}


@pytest.mark.parametrize("key", sorted(k for k, q in QUESTIONS.items()
                                       if not any(p.default is p.empty for p in inspect.signature(q.compute).parameters.values())))
def test_each_answer_computes_its_text(key, capsys):
    course.answer(key)
    out = capsys.readouterr().out
    assert out.startswith(f"Answer: {QUESTIONS[key].asked} (open it once you have tried)")
    assert any(ch.isdigit() for ch in out.split("\n", 1)[1]), "an answer's numbers are computed and shown"


def test_an_answer_taking_the_notebooks_values():
    import torch

    k_cache = torch.zeros(8, 16, 2, 32, dtype=torch.bfloat16)
    text = QUESTIONS["nb00.kv_bytes"].compute(k_cache=k_cache, num_layers=4)
    assert "2 x 2 x 32 x 2 = **256 bytes per layer**" in text and "**1,024 bytes**" in text


def test_in_a_notebook_the_answer_is_folded(monkeypatch):
    shown = []
    monkeypatch.setattr("minivllm.course.display.in_notebook", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    course.answer("nb05.slots")
    (bundle,) = shown  # an HTML <details> block (GitHub and Colab fold it too), no answer in plain text
    html = bundle["text/html"]
    assert html.startswith("<details><summary>Answer: blocks of 16") and html.endswith("</details>")
    assert bundle["text/plain"].startswith("[folded] Answer: blocks of 16")
    assert not any(ch.isdigit() for ch in bundle["text/plain"].partition("?")[2])


def test_unknown_keys_are_named():
    with pytest.raises(KeyError, match=r"no answer 'nb04.nothing'; nb04 has: nb04.new_blocks"):
        course.answer("nb04.nothing")
    with pytest.raises(KeyError, match=r"nb77 has: none"):
        course.answer("nb77.x")
    with pytest.raises(ValueError, match="an answer's key is 'nbNN.name'"):
        answers.question("notebook4", "?")
