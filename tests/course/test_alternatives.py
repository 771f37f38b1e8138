"""One grader: an answer that keeps an exercise's contract, written differently from
``solutions/``, passes ``minivllm grade`` and ``pytest -m exNN`` alike.

``tests/course/alternatives/`` holds, for every exercise from 02 on, a second correct answer:
other data structures, another order of work. Each is graded in a copy of the course that has
``exercises/`` alone (no ``solutions/``, as a student's copy may be): the exercises it builds on
are the reference answers, put where a student's finished work would be, and the exercise itself
is the alternative. Both graders must pass it. The mutants (``test_course.py``) and the handed-on
answers (``test_handed_on.py``) are the other side: wrong or borrowed answers both graders fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm.course.loader import course_root

HERE = Path(__file__).resolve().parent
ALTERNATIVES = sorted((HERE / "alternatives").glob("ex[0-9][0-9]_*.py"))
REPO = Path(__file__).resolve().parents[2]


def course_copy(tmp_path: Path, alternative: Path) -> Path:
    """A course root with ``exercises/`` only: every reference answer as a student's finished file,
    ``alternative`` in place of its exercise's."""
    root = tmp_path / "course"
    (root / "exercises").mkdir(parents=True)
    for solution in sorted((course_root() / "solutions").glob("ex[0-9][0-9]_*.py")):
        shutil.copy(solution, root / "exercises" / solution.name)
    shutil.copy(alternative, root / "exercises" / alternative.name)
    return root


def run(command: list[str], root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINIVLLM_COURSE_ROOT": str(root), "TRITON_INTERPRET": "1"}
    env.pop("MINIVLLM_SOLUTIONS", None)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)


def test_every_exercise_from_02_on_has_an_alternative():
    have = {path.name.split("_")[0] for path in ALTERNATIVES}
    want = {path.name.split("_")[0] for path in (course_root() / "solutions").glob("ex[0-9][0-9]_*.py")}
    missing = sorted(name for name in want - have if name >= "ex02")
    assert not missing, f"no alternative correct answer in tests/course/alternatives/ for {missing}"


def answer_lines(path: Path) -> set[str]:
    """The long lines (over 30 characters, stripped) of a reference answer's solution regions that
    its stub does not also have: what a student writes."""
    given = {line.strip() for line in (course_root() / "exercises" / path.name).read_text().splitlines()}
    lines, inside = set(), False
    for line in path.read_text().splitlines():
        marker = line.strip()
        if marker.startswith("# BEGIN SOLUTION"):
            inside = True
        elif marker.startswith("# END SOLUTION"):
            inside = False
        elif inside and len(marker) > 30 and marker not in given:
            lines.add(marker)
    return lines


def test_an_alternative_is_not_the_reference_renamed():
    for path in ALTERNATIVES:
        answer = answer_lines(course_root() / "solutions" / path.name)
        mine = {line.strip() for line in path.read_text().splitlines()}
        shared = len(answer & mine)
        assert shared < 0.5 * max(len(answer), 1), (
            f"{path.name} repeats {shared} of the {len(answer)} long lines of the reference's answer")


@pytest.mark.slow
@pytest.mark.parametrize("alternative", ALTERNATIVES, ids=[p.name.split("_")[0] for p in ALTERNATIVES])
def test_both_graders_pass_an_alternative_correct_answer(alternative, tmp_path):
    root = course_copy(tmp_path, alternative)
    number = alternative.name.split("_")[0]
    grade = run([sys.executable, "-c", "import sys; from minivllm.cli import main; sys.exit(main())", "grade", number], root)
    assert grade.returncode == 0, f"minivllm grade {number} failed it:\n{grade.stdout[-3000:]}{grade.stderr[-2000:]}"
    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", number,
                 "tests/exercises"], root)
    assert tests.returncode == 0, f"pytest -m {number} failed it:\n{tests.stdout[-4000:]}{tests.stderr[-2000:]}"
