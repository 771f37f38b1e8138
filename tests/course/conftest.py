"""The course machinery's own tests (generation, grading, the mutation suite, the notebooks'
rules) read the reference solutions. A copy of the course without ``solutions/`` (a student's,
``MINIVLLM_COURSE_ROOT`` pointing at it) still runs ``pytest -m ex04`` and the rest of the suite:
these modules are not collected there."""

from __future__ import annotations

from minivllm.course.loader import course_root, has_solutions


def pytest_ignore_collect(collection_path, config):
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return not has_solutions(course_root()) or None
    return None
