"""``minivllm grade`` and ``minivllm course make-exercises`` (hooked into ``minivllm.cli``)."""

from __future__ import annotations

import argparse
import sys


def add_commands(sub) -> None:
    grade = sub.add_parser("grade", help="grade your exercises and print the scoreboard")
    grade.add_argument("exercises", nargs="*", help="exercise names or numbers (default: all), e.g. ex02 or 2")
    grade.add_argument("--solutions", action="store_true", help="grade the reference solutions instead")
    grade.add_argument("-q", "--quiet", action="store_true", help="one line per exercise")
    grade.set_defaults(func=_grade)

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
            mark = "✓" if r.passed else "✗"
            print(f"{mark} {r.exercise:<24} {r.num_passed:>3}/{len(r.results)}")
        else:
            print(r.render(verbose=True))
            print()
    done = sum(r.passed for r in reports)
    print(f"{done}/{len(reports)} exercises complete, {passed}/{total} checks passed")
    return 0 if done == len(reports) else 1


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
