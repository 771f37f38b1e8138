"""``minivllm grade``, ``minivllm hint`` and ``minivllm course make-exercises`` (hooked into
``minivllm.cli``)."""

from __future__ import annotations

import argparse
import sys


def add_commands(sub) -> None:
    grade = sub.add_parser("grade", help="grade your exercises and print the scoreboard")
    grade.add_argument("exercises", nargs="*",
                       help="exercise names or numbers (default: all, then the capstone), e.g. ex02, 2 or capstone")
    grade.add_argument("--solutions", action="store_true", help="grade the reference solutions instead")
    grade.add_argument("-q", "--quiet", action="store_true", help="one line per exercise")
    grade.set_defaults(func=_grade)

    hint = sub.add_parser("hint", help="the next hint of an exercise (counted on the scoreboard)")
    hint.add_argument("exercise", help="exercise name or number, e.g. ex04 or 4")
    hint.add_argument("--about", default=None, help="the next hint about this (a function name, say)")
    hint.add_argument("--review", action="store_true", help="show the hints already seen again")
    hint.set_defaults(func=_hint)

    course = sub.add_parser("course", help="course maintenance")
    course_sub = course.add_subparsers(dest="course_command", required=True)
    make = course_sub.add_parser("make-exercises", help="regenerate exercises/ from solutions/")
    make.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    make.set_defaults(func=_make_exercises)


def _grade(args: argparse.Namespace) -> int:
    from minivllm import course

    reports = course.grade(args.exercises or None, solutions=True if args.solutions else None)
    total = sum(len(r.results) for r in reports)
    passed = sum(r.num_passed for r in reports)
    for r in reports:
        if args.quiet:
            mark = "✓" if r.passed else "✗" if r.wrong else "·"
            hints = f"  ({r.hints[0]} of {r.hints[1]} hints used)" if r.hints and r.hints[0] else ""
            print(f"{mark} {r.exercise:<24} {r.num_passed:>3}/{len(r.results)}{hints}")
        else:
            print(r.render(verbose=True))
            print()
    exercises = [r for r in reports if r.exercise != "capstone"]
    done = sum(r.passed for r in exercises)
    used = sum(r.hints[0] for r in reports if r.hints)
    hints = f", {used} hint{'s' if used != 1 else ''} used" if any(r.hints for r in reports) else ""
    capstone = next((r for r in reports if r.exercise == "capstone"), None)
    whole = "" if capstone is None else f"; the capstone {'serves' if capstone.passed else 'is to do'}"
    print(f"{done}/{len(exercises)} exercises complete, {passed}/{total} checks passed{hints}{whole}")
    return 0 if all(r.passed for r in reports) else 1


def _hint(args: argparse.Namespace) -> int:
    from minivllm import course

    try:
        course.hint(args.exercise, about=args.about, review=args.review)
    except (KeyError, ValueError) as err:
        print(err.args[0] if err.args else err, file=sys.stderr)
        return 2
    return 0


def _make_exercises(args: argparse.Namespace) -> int:
    from minivllm.course.exgen import stale_exercises, write_exercises
    from minivllm.course.loader import course_root

    root = course_root()
    if args.check:
        stale = stale_exercises(root)
        for name in stale:
            print(f"stale: {name}")
        if stale:
            print("run `minivllm course make-exercises` and commit the result", file=sys.stderr)
        return 1 if stale else 0
    written = write_exercises(root)
    for name in written:
        print(f"wrote {name}")
    if not written:
        print("exercises/ is up to date")
    return 0
