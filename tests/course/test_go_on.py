"""A partial copy of the course (no ``solutions/``, no ``benchmarks/``) still runs a notebook to
its end: the cell guard of ``minivllm.course.go_on`` turns what the copy cannot do into a line of
output, and nothing else."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from minivllm import course
from minivllm.course import go_on


@pytest.fixture
def partial_copy(tmp_path, monkeypatch):
    """A course root holding one exercise stub and nothing else."""
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ex99_demo.py").write_text(textwrap.dedent('''
        def schedule():
            raise NotImplementedError("exercise 99: write schedule()")
    '''))
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.setattr(go_on, "_cells_cut_short", 0)
    spec = importlib.util.spec_from_file_location("ex99_demo", tmp_path / "exercises" / "ex99_demo.py")
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    return stub


def run_cell(code: str, namespace: dict) -> object:
    """Run ``code`` as a guarded notebook cell; the value its last expression displays."""
    tree = go_on._Guard().visit(ast.parse(textwrap.dedent(code)))
    exec(compile(tree, "<cell>", "exec"), namespace)
    return namespace.get(go_on._RESULT)


def test_a_stub_cuts_its_cell_short_and_later_cells_go_on(partial_copy, capsys):
    ns = {"ex": partial_copy}
    assert run_cell("x = 1\nplan = ex.schedule()\nprint('not reached')", ns) is None
    assert "ex99_demo's `schedule` is not written yet" in capsys.readouterr().out
    assert ns["x"] == 1 and "plan" not in ns
    run_cell("print(len(plan))", ns)  # a name the cut-short cell would have defined
    assert "plan comes from a cell above that did not run to its end" in capsys.readouterr().out
    assert run_cell("x + 1", ns) == 2  # the last expression is still the cell's value


def test_other_errors_are_errors(partial_copy):
    with pytest.raises(ZeroDivisionError):
        run_cell("1 / 0", {})
    with pytest.raises(NotImplementedError):  # not raised by a stub of exercises/
        run_cell("raise NotImplementedError('elsewhere')", {})
    with pytest.raises(NameError):  # no cell was cut short yet
        run_cell("undefined_name", {})


def test_a_missing_course_file_is_said_and_skipped(partial_copy, capsys):
    run_cell("import minivllm.course as c\nc.course_file('benchmarks/no_such_benchmark.py')", {})
    assert "benchmarks/no_such_benchmark.py is not in this copy of the course" in capsys.readouterr().out


def test_working_gives_back_the_students_module_when_nothing_can_stand_in(tmp_path, monkeypatch, capsys):
    (tmp_path / "exercises").mkdir()
    source = (course.course_root() / "exercises" / "ex10_costs.py").read_text()
    (tmp_path / "exercises" / "ex10_costs.py").write_text(source)
    monkeypatch.setenv("MINIVLLM_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("MINIVLLM_SOLUTIONS", raising=False)  # the student's file, whatever the run grades
    assert not course.has_solutions()
    ex = course.load("ex10_costs")
    assert course.working(ex) is ex
    assert "no solutions/ to stand in for it" in capsys.readouterr().out


def test_the_guard_is_on_only_in_a_partial_copy(tmp_path):
    """In IPython, importing the course guards later cells where the copy lacks solutions/; the
    full course runs cells as written."""
    pytest.importorskip("IPython")
    probe = textwrap.dedent('''
        from IPython.testing.globalipapp import start_ipython
        shell = start_ipython()
        import minivllm.course
        from minivllm.course import go_on
        print(go_on.install(), any(isinstance(t, go_on._Guard) for t in shell.ast_transformers))
    ''')
    (tmp_path / "exercises").mkdir()
    env_partial = {"MINIVLLM_COURSE_ROOT": str(tmp_path)}
    runs = {}
    for name, extra in (("full", {}), ("partial", env_partial)):
        env = {k: v for k, v in os.environ.items() if k != "MINIVLLM_COURSE_ROOT"} | extra
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        runs[name] = out.stdout.strip().splitlines()[-1]
    assert runs == {"full": "False False", "partial": "True True"}
