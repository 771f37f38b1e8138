"""Your work on Colab: where ``exercises/`` lives, so that it outlives the runtime.

A Colab runtime is a machine lent for a while: when it is recycled (idle too long, a restart
from the menu, a new day) everything under ``/content`` is gone, the course's clone and your
``exercises/`` with it. The setup cell of every notebook fetches the course again; this module
keeps your answers apart from it, in one of two ways:

* **On Google Drive** (the default): :func:`keep_work` mounts your Drive and makes the course's
  ``exercises/`` a link to ``MyDrive/minivllm-work/exercises``. The first time, the fresh
  exercise files are copied there; after a recycle the link is made again and your files are
  where you left them. An exercise that a newer release of the course adds is copied in beside
  them; none of yours is ever overwritten.
* **Without Drive** (``KEEP_WORK_ON_DRIVE = False`` in the setup cell, or Drive could not be
  mounted): ``exercises/`` stays in ``/content``. :func:`save_work` downloads it as a zip;
  :func:`restore_work` uploads that zip into a new runtime.

Off Colab nothing here is needed: your clone of the course is on your own disk.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
import time
import zipfile
from pathlib import Path

DRIVE_MOUNT = "/content/drive"
WORK_FOLDER = "MyDrive/minivllm-work"  # under the Drive mount: where exercises/ is kept
_EXERCISE_FILE = re.compile(r"ex[0-9][0-9]_[a-z0-9_]+\.py")


def keep_work(course_dir: str | os.PathLike, work_dir: str | os.PathLike | None) -> Path:
    """Make ``course_dir/exercises`` the student's lasting copy; returns where it lives.

    ``work_dir``: a folder on the mounted Drive (``/content/drive/MyDrive/minivllm-work``) whose
    ``exercises/`` holds the work; the Drive is mounted first if it is not. ``None``: keep
    nothing (say how to save and restore by hand)."""
    exercises = Path(course_dir) / "exercises"
    if work_dir is None:
        print(_by_hand_note(exercises))
        return exercises
    work_dir = Path(work_dir)
    try:
        _mount_drive_for(work_dir)
    except Exception as err:  # noqa: BLE001 - no Drive (refused, offline): the work stays here
        print(f"Google Drive could not be mounted ({type(err).__name__}: {err}).")
        print(_by_hand_note(exercises))
        return exercises
    kept = work_dir / "exercises"
    if exercises.is_symlink() and exercises.resolve() == kept.resolve():
        print(f"your exercises are kept on Drive: {kept}")
        return kept
    fresh = Path(course_dir) / "exercises.release"  # this release's untouched files, for reference
    if fresh.exists():
        shutil.rmtree(fresh)
    exercises.rename(fresh)
    if kept.is_dir():
        added = [f.name for f in sorted(fresh.glob("*.py")) if not (kept / f.name).exists()]
        for name in added:
            shutil.copy2(fresh / name, kept / name)
        note = f" (new in this release, copied in: {', '.join(added)})" if added else ""
        print(f"your exercises are back from Drive: {kept}{note}")
    else:
        shutil.copytree(fresh, kept)
        print(f"your exercises are kept on Drive from now on: {kept}")
    exercises.symlink_to(kept, target_is_directory=True)
    return kept


def _mount_drive_for(work_dir: Path) -> None:
    """Mount Google Drive if ``work_dir`` lies under its mount point and it is not mounted."""
    mount = Path(DRIVE_MOUNT) if str(work_dir).startswith(DRIVE_MOUNT) else _mount_point_of(work_dir)
    if mount is None or (mount / "MyDrive").is_dir():
        work_dir.mkdir(parents=True, exist_ok=True)
        return
    from google.colab import drive  # only on Colab

    drive.mount(str(mount))
    work_dir.mkdir(parents=True, exist_ok=True)


def _mount_point_of(work_dir: Path) -> Path | None:
    """The folder above ``MyDrive`` in ``work_dir`` (a Drive mounted elsewhere), if any."""
    parts = work_dir.parts
    return Path(*parts[: parts.index("MyDrive")]) if "MyDrive" in parts else None


def _by_hand_note(exercises: Path) -> str:
    return (f"your exercises are in {exercises}, which disappears when this runtime is recycled: "
            "run `from minivllm.course.colab import save_work; save_work()` to download them as a zip, "
            "and `restore_work()` in a new runtime to put them back")


def save_work(course_dir: str | os.PathLike | None = None, to: str | os.PathLike | None = None) -> Path:
    """Zip ``exercises/`` (its ``exNN_*.py`` files) to ``to`` (default: a dated file in the
    working folder) and, on Colab, download it; returns the zip's path."""
    exercises = _exercises(course_dir)
    path = Path(to) if to is not None else Path.cwd() / f"minivllm-work-{time.strftime('%Y%m%d-%H%M%S')}.zip"
    files = sorted(f for f in exercises.glob("*.py") if _EXERCISE_FILE.fullmatch(f.name))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            zf.write(f, f"exercises/{f.name}")
    print(f"saved {len(files)} exercise files to {path}")
    if "google.colab" in sys.modules:
        from google.colab import files as colab_files

        colab_files.download(str(path))
    return path


def restore_work(zip_path: str | os.PathLike | None = None, course_dir: str | os.PathLike | None = None
                 ) -> list[str]:
    """Put back the exercise files of a zip made by :func:`save_work` (on Colab, with no path:
    upload it). Only ``exercises/exNN_*.py`` entries are read; returns the files restored."""
    exercises = _exercises(course_dir)
    if zip_path is None:
        if "google.colab" not in sys.modules:
            raise ValueError("give the path of the zip that save_work() made")
        from google.colab import files as colab_files

        uploaded = colab_files.upload()  # {file name: bytes}
        if not uploaded:
            raise ValueError("no file was uploaded")
        data = next(iter(uploaded.values()))
    else:
        data = Path(zip_path).read_bytes()
    restored = []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for name in zf.namelist():
            folder, _, base = name.rpartition("/")
            if folder != "exercises" or not _EXERCISE_FILE.fullmatch(base):
                continue  # nothing outside exercises/, no paths that climb out of it
            (exercises / base).write_bytes(zf.read(name))
            restored.append(base)
    print(f"restored {len(restored)} exercise files into {exercises}")
    return sorted(restored)


def _exercises(course_dir: str | os.PathLike | None) -> Path:
    if course_dir is None:
        from minivllm.course.loader import course_root

        course_dir = course_root()
    folder = Path(course_dir) / "exercises"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: is this the course's folder?")
    return folder
