"""What a student gets besides the checks: hints one at a time (counted on the scoreboard), a
check that lets Run All go on while nothing is solved but stops at a wrong answer, labels that
say whose code ran, and a copy of the course with the exercises alone."""

from __future__ import annotations

import json
import shutil

import pytest

from minivllm import course
from minivllm.cli import main as cli_main
from minivllm.course import exgen, hints
from minivllm.course.loader import load_path

ROOT = course.course_root()
NAMES = course.exercise_names()


@pytest.fixture()
def student_copy(tmp_path, monkeypatch):
    """A fresh copy of the course (solutions, freshly generated stubs) that the tests may
    write progress into, selected with MINIVLLM_COURSE_ROOT."""
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    exgen.write_exercises(tmp_path)
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    return tmp_path


# --- hints ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_has_hints_with_headings(name):
    found = hints.hints_for(name)
    assert found, f"write minivllm/course/hints/{name}.md: '## <what it is about>' then the hint"
    for h in found:
        assert h.about and h.text, f"{name} hint {h.number} needs a heading and a text"


def test_hints_come_one_at_a_time_and_are_counted(student_copy, capsys):
    written = hints.hints_for("ex04_block_allocator")
    course.hint("ex04")
    first = capsys.readouterr().out
    assert f"ex04 hint 1 of {len(written)}" in first and written[0].text in first
    course.hint(4)
    assert f"ex04 hint 2 of {len(written)}" in capsys.readouterr().out
    assert hints.seen("ex04_block_allocator") == [1, 2]
    record = json.loads((student_copy / "exercises" / hints.PROGRESS_FILE).read_text())
    assert record == {"hints_seen": {"ex04_block_allocator": [1, 2]}}
    # the scoreboard, in the notebook and on the command line, says how many were used
    report = course.check("ex04", raise_on_failure=False)
    assert report.hints == (2, len(written))
    assert f"(exercises; 2 of {len(written)} hints used)" in capsys.readouterr().out
    assert cli_main(["grade", "ex04", "-q"]) == 1
    assert f"(2 of {len(written)} hints used)" in capsys.readouterr().out


def test_review_shows_again_and_counts_nothing(student_copy, capsys):
    course.hint("ex04", review=True)
    assert "not asked for a hint for ex04_block_allocator yet" in capsys.readouterr().out
    course.hint("ex04")
    capsys.readouterr()
    course.hint("ex04", review=True)
    course.hint("ex04", review=True)
    assert capsys.readouterr().out.count("ex04 hint 1 of") == 2
    assert hints.seen("ex04_block_allocator") == [1]


def test_a_hint_about_a_function_and_the_end_of_the_hints(student_copy, capsys):
    about_free = [h for h in hints.hints_for("ex04_block_allocator") if "free" in h.about.lower()]
    for h in about_free:
        course.hint("ex04", about="free")
        assert f"({h.about})" in capsys.readouterr().out
    course.hint("ex04", about="free")
    assert f"No more hints about 'free' for ex04_block_allocator: you have seen all {len(about_free)}" in (
        capsys.readouterr().out)
    with pytest.raises(ValueError, match="no hint of ex04_block_allocator is about 'nowhere'; its hints are about"):
        course.hint("ex04", about="nowhere")
    with pytest.raises(KeyError, match="no exercise called 'ex77'"):
        course.hint("ex77")


def test_a_damaged_progress_file_is_named(student_copy):
    (student_copy / "exercises" / hints.PROGRESS_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"\.course_progress\.json is not the course's progress file"):
        course.hint("ex04")


def test_a_read_only_copy_still_gives_the_hint(student_copy, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(hints.os, "replace", refuse)
    course.hint("ex04")
    out = capsys.readouterr().out
    assert "ex04 hint 1 of" in out and "could not record the hint" in out and "read-only" in out


def test_the_minivllm_hint_command(student_copy, capsys):
    assert cli_main(["hint", "ex02"]) == 0
    assert "ex02 hint 1 of" in capsys.readouterr().out
    assert cli_main(["hint", "ex02", "--about", "nowhere"]) == 2
    assert "its hints are about" in capsys.readouterr().err


def test_a_maintainers_copy_must_not_carry_a_hint_record(student_copy):
    assert exgen.stale_exercises(student_copy) == []
    course.hint("ex00")
    assert exgen.stale_exercises(student_copy) == [f"exercises/{hints.PROGRESS_FILE} (the hints seen here: delete it)"]


# --- check: todo goes on, a wrong answer stops ---------------------------------------------------
def test_an_untouched_stub_prints_its_scoreboard_and_does_not_raise(student_copy, capsys):
    report = course.check(course.load("ex00"))
    out = capsys.readouterr().out
    assert not report.passed and not report.started and not report.wrong
    assert f"not started: {len(report.results)} cases todo. The cells below use the reference solution" in out
    assert course.label(course.working(report_module := course.load("ex00"))) == "reference"
    assert course.label(report_module) == "yours"
    assert cli_main(["grade", "ex00"]) == 1  # the terminal's verdict still says: not done


def test_a_partly_written_exercise_is_in_progress(student_copy, capsys):
    """Cases that pass next to cases still todo: no error, a note that says how far it is."""
    solution = (ROOT / "solutions" / "ex00_kv_memory.py").read_text()
    stub = exgen.make_exercise(solution, "ex00_kv_memory")
    one_done = stub.replace(  # kv_bytes_per_token written, the other three still stubs
        stub.split("def kv_bytes_per_token")[1].split("def kv_bytes_per_sequence")[0],
        solution.split("def kv_bytes_per_token")[1].split("def kv_bytes_per_sequence")[0])
    path = student_copy / "exercises" / "ex00_kv_memory.py"
    path.write_text(one_done)
    report = course.check(course.load("ex00"))
    c = report.counts()
    assert c["pass"] and c["todo"] and not report.wrong
    assert f"in progress: {c['pass']} of {len(report.results)} cases pass, {c['todo']} still todo" in (
        capsys.readouterr().out)


def test_a_wrong_answer_raises_a_short_error(tmp_path):
    text = (ROOT / "solutions" / "ex01_static_waste.py").read_text()
    path = tmp_path / "ex01_static_waste.py"
    path.write_text(text.replace("acc.idle_rows += sum(longest_out - n for n in outs)", "acc.idle_rows += 0"))
    with pytest.raises(course.CheckFailed) as err:
        course.check(load_path(path, "ex01_static_waste", "exercises"))
    # what IPython shows instead of a traceback through the course's code: one line
    shown = err.value._render_traceback_()
    assert len(shown) == 1 and shown[0].startswith("CheckFailed: ex01_static_waste: ")
    assert "the scoreboard above says which case and why" in shown[0]


def test_a_report_shown_by_check_is_not_shown_again(capsys):
    report = course.check(course.load("ex00", solutions=True))
    capsys.readouterr()
    report._ipython_display_()  # what a notebook does with the cell's last value
    assert capsys.readouterr().out == ""


def test_label_needs_a_course_module():
    assert course.label(course.load("ex00", solutions=True)) == "reference"
    with pytest.raises(TypeError, match="needs a module from course.load"):
        course.label("ex00")


# --- a copy with the exercises alone ------------------------------------------------------------
def test_a_copy_with_only_exercises_lists_and_loads_them(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises",
                    ignore=shutil.ignore_patterns(hints.PROGRESS_FILE, "__pycache__"))
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)
    assert course.exercise_names() == NAMES and not course.has_solutions()
    ex = course.load("ex04")
    assert ex.__course_source__ == "exercises" and ex.__exercise__ == "ex04_block_allocator"
    course.check(ex)
    assert "This copy has no solutions/, so the cells below need yours" in capsys.readouterr().out
    assert course.working(ex) is ex  # nothing to stand in: yours, and the cells that need it say so
    assert "no solutions/ to stand in for it" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="has no reference solutions"):
        course.load("ex04", solutions=True)
    assert cli_main(["grade", "ex00", "-q"]) == 1
    assert "0/1 exercises complete" in capsys.readouterr().out


def test_an_empty_copy_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    with pytest.raises(KeyError, match="exercises: none"):
        course.load("ex04")
