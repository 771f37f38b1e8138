"""Hints on request, one at a time: ``course.hint("ex04")`` shows the next hint of exercise 04,
and the scoreboard says how many were used.

A stub states what its function must do, not how; when a student is stuck, the hints say more,
in steps. An exercise's hints are a Markdown file, ``minivllm/course/hints/<exercise>.md``:

    # Exercise 04: hints          <- anything before the first "## " is for maintainers
    ## BlockPool.allocate         <- one hint: the heading says what it is about
    All or nothing: ...           <- the text the student sees

Hints are given in the file's order, so write them from the least to the most telling: a
nudge first, the design last, never the code. ``course.hint("ex04", about="free")`` takes the
next hint whose heading mentions ``free``; ``course.hint("ex04", review=True)`` shows again the
ones already seen.

Which hints a student has seen is kept in ``exercises/.course_progress.json``, next to their
work, so that it survives a kernel restart and, committed with the exercises, reaches the
scoreboard of their fork's CI.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from minivllm.course.display import markdown
from minivllm.course.loader import course_root, resolve_name

HINTS_DIR = Path(__file__).resolve().parent / "hints"
PROGRESS_FILE = ".course_progress.json"  # in exercises/


@dataclass(frozen=True)
class Hint:
    number: int  # 1-based position in the exercise's hint file: the order they are given in
    about: str  # its heading: a function, or a step of the design
    text: str  # Markdown


def hints_for(exercise: str) -> list[Hint]:
    """The hints of ``exercise`` (full name), in order; ``[]`` when it has no hint file."""
    path = HINTS_DIR / f"{exercise}.md"
    if not path.is_file():
        return []
    sections = re.split(r"^## +", path.read_text(encoding="utf-8"), flags=re.M)[1:]
    hints = []
    for number, section in enumerate(sections, start=1):
        about, _, text = section.partition("\n")
        hints.append(Hint(number, about.strip(), text.strip()))
    return hints


# --- what the student has seen --------------------------------------------------------------
def progress_path(root: Path | None = None) -> Path:
    return (root or course_root()) / "exercises" / PROGRESS_FILE


def _read_progress(root: Path | None = None) -> dict:
    path = progress_path(root)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not the course's progress file ({err}); delete it to start afresh") from None
    return data if isinstance(data, dict) else {}


def seen(exercise: str, root: Path | None = None) -> list[int]:
    """The numbers of the hints of ``exercise`` (full name) already shown, in order."""
    numbers = _read_progress(root).get("hints_seen", {}).get(exercise, [])
    return [n for n in numbers if isinstance(n, int)]


def _record(exercise: str, number: int, root: Path | None = None) -> None:
    path = progress_path(root)
    if not path.parent.is_dir():  # no exercises/ folder (a bare install): nothing to keep
        return
    data = _read_progress(root)
    numbers = data.setdefault("hints_seen", {}).setdefault(exercise, [])
    if number not in numbers:
        numbers.append(number)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)  # a reader never sees half a file
    except OSError as err:  # a read-only copy: the hint is still given, only not counted
        print(f"(could not record the hint in {path}: {err})")


def usage(exercise: str, root: Path | None = None) -> tuple[int, int]:
    """``(hints seen, hints written)`` for ``exercise`` (full name): the scoreboard's count."""
    written = {h.number for h in hints_for(exercise)}
    return len(written.intersection(seen(exercise, root))), len(written)


# --- the notebook's call ----------------------------------------------------------------------
def hint(exercise: str, about: str | None = None, review: bool = False) -> None:
    """Show the next hint of ``exercise`` (``"ex04"``, ``4`` or the full name) and remember that
    it was seen. ``about`` picks the next one whose heading contains that text (a function
    name, say); ``review=True`` shows the hints already seen instead, and counts nothing."""
    name = resolve_name(str(exercise))
    short = name.split("_")[0]
    hints = hints_for(name)
    if not hints:
        markdown(f"No hints are written for {name} yet.")
        return
    done = seen(name)
    if review:
        shown = [h for h in hints if h.number in done]
        if not shown:
            markdown(f"You have not asked for a hint for {name} yet: `course.hint({short!r})` gives the first.")
        for h in shown:
            markdown(_format(h, len(hints), short))
        return
    candidates = hints
    if about is not None:
        candidates = [h for h in hints if about.lower() in h.about.lower()]
        if not candidates:
            topics = "; ".join(dict.fromkeys(h.about for h in hints))
            raise ValueError(f"no hint of {name} is about {about!r}; its hints are about: {topics}")
    fresh = [h for h in candidates if h.number not in done]
    if not fresh:
        which = f" about {about!r}" if about is not None else ""
        markdown(f"No more hints{which} for {name}: you have seen all {len(candidates)}. "
                 f"`course.hint({short!r}, review=True)` shows them again.")
        return
    _record(name, fresh[0].number)
    markdown(_format(fresh[0], len(hints), short))


def _format(h: Hint, total: int, short: str) -> str:
    return f"**{short} hint {h.number} of {total}** ({h.about})\n\n{h.text}"
