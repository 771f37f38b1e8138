"""Find the course folders and import a student's (or the reference) exercise module.

Exercise files are imported from their path, not as a package, and afresh on every call, so
that a student who edits ``exercises/ex02_continuous.py`` and re-runs the notebook's check cell
sees the new code without restarting the kernel.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

SOLUTIONS_ENV = "MINIVLLM_SOLUTIONS"
ROOT_ENV = "MINIVLLM_COURSE_ROOT"


def use_solutions() -> bool:
    """True when ``MINIVLLM_SOLUTIONS`` is set to something other than ''/0/false/no."""
    return os.environ.get(SOLUTIONS_ENV, "").strip().lower() not in ("", "0", "false", "no")


def course_root() -> Path:
    """The repository root: ``$MINIVLLM_COURSE_ROOT``, else the folder above the package
    (an editable install or a clone), else the nearest parent of the working directory that
    holds ``exercises/``. A copy may hold ``exercises/`` alone (no reference solutions)."""
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parents[2]
    if (here / "solutions").is_dir() or (here / "exercises").is_dir():
        return here
    cwd = Path.cwd().resolve()
    for folder in (cwd, *cwd.parents):
        if (folder / "exercises").is_dir():
            return folder
    raise FileNotFoundError(
        "cannot find the course folders (exercises/, and solutions/ for the reference); run from "
        f"the repository or set {ROOT_ENV} to its path"
    )


def has_solutions(root: Path | None = None) -> bool:
    """Whether this copy of the course has the reference solutions (``solutions/``)."""
    return bool(_names_in((root or course_root()) / "solutions"))


def exercise_names(root: Path | None = None) -> list[str]:
    """Every exercise, in order: those of ``solutions/exNN_*.py`` and of ``exercises/exNN_*.py``
    together, so that a copy of the course that lacks one reference file (or holds
    ``exercises/`` alone) still lists every exercise it has."""
    root = root or course_root()
    return sorted(set(_names_in(root / "solutions")) | set(_names_in(root / "exercises")))


def _names_in(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("ex[0-9][0-9]_*.py"))


def resolve_name(name: str, root: Path | None = None) -> str:
    """Accept ``ex02_continuous``, ``ex02`` or ``2``; return the full exercise name."""
    names = exercise_names(root)
    if name in names:
        return name
    key = name.strip()
    if key.isdigit():
        key = f"ex{int(key):02d}"
    matches = [n for n in names if n.split("_")[0] == key]
    if len(matches) == 1:
        return matches[0]
    listed = ", ".join(names) or f"none (no exNN_*.py in {(root or course_root())}/solutions or exercises)"
    raise KeyError(f"no exercise called {name!r}; exercises: {listed}")


def load(name: str, solutions: bool | None = None, root: Path | None = None) -> ModuleType:
    """Import exercise ``name`` from ``exercises/`` (the student's work) or ``solutions/``.

    ``solutions=None`` follows ``$MINIVLLM_SOLUTIONS``. The module gets ``__exercise__`` (its
    name) and ``__course_source__`` ("exercises" or "solutions") so a check can report which
    file it graded.
    """
    root = root or course_root()
    name = resolve_name(name, root)
    folder = "solutions" if (use_solutions() if solutions is None else solutions) else "exercises"
    path = root / folder / f"{name}.py"
    if not path.is_file():
        if folder == "exercises":
            fix = "run `minivllm course make-exercises`"
        elif has_solutions(root):
            fix = f"this copy of the course has no reference solution for {name}"
        else:
            fix = "this copy of the course has no reference solutions"
        raise CourseFileMissing(f"{path} does not exist; {fix}")
    return load_path(path, name, folder)


def load_or_error(name: str, solutions: bool | None) -> ModuleType | BaseException:
    """:func:`load`, or what its file raised as it ran (a syntax error, say, or a ``SystemExit``
    at its top level), for a grader to report; a Ctrl-C the user pressed goes on up."""
    from minivllm.course.grading import pressed_ctrl_c, watching_interrupts

    with watching_interrupts():
        try:
            return load(name, solutions=solutions)
        except BaseException as err:
            if pressed_ctrl_c(err):
                raise
            return err


def load_path(path: Path, name: str, source: str) -> ModuleType:
    """Execute the file at ``path`` as a fresh module (registered in ``sys.modules`` while it
    runs, so dataclasses and pickling work)."""
    mod_name = f"_minivllm_course_{source}_{name}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    module.__exercise__ = name
    module.__course_source__ = source
    return module


class CourseFileMissing(FileNotFoundError):
    """A file of the full course (a benchmark script, a page of docs/) that this copy of the
    course does not have."""


def course_file(relative: str | Path, root: Path | None = None) -> Path:
    """A file or folder of the full course (``benchmarks/...``, ``docs/...``): the course's own,
    else the one beside the installed package (a copy of the course made from the clone that
    minivllm was installed from). Neither: :class:`CourseFileMissing`."""
    for base in (root or course_root(), Path(__file__).resolve().parents[2]):
        if (base / relative).exists():
            return base / relative
    raise CourseFileMissing(f"{Path(relative).as_posix()} is not in this copy of the course")


def benchmarks_dir(root: Path | None = None) -> Path | None:
    """Where the benchmark scripts are (:func:`course_file`), or ``None``."""
    try:
        return course_file("benchmarks", root)
    except CourseFileMissing:
        return None


def load_benchmark(name: str, root: Path | None = None) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as a module, so that a notebook reuses a benchmark's
    functions instead of copying them (the benchmarks are scripts, not a package)."""
    path = course_file(f"benchmarks/{name}.py", root)
    mod_name = f"_minivllm_benchmark_{name}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module
