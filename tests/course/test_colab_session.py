"""A student's Colab session, played on this machine.

Colab is a fresh Python with torch, triton, transformers, ipywidgets and Jupyter preinstalled, a
``google.colab`` module, and a ``/content`` folder that disappears when the runtime is recycled.
The session test builds exactly that: a new virtualenv holding only :data:`COLAB_PREINSTALLED`
(at the versions installed here, so nothing new is downloaded), a fake ``google.colab`` whose
``drive.mount`` links a folder that outlives the "runtime", and the repository served from a
local copy over ``file://`` with its release tagged. It runs notebook 00 top to bottom the way
Colab does (opened on its own, the setup cell fetching and installing the course), edits an
exercise as a student would, recycles the runtime (a new ``/content``), runs the setup cell again
and finds the edit back. The quicker tests below hold :mod:`minivllm.course.colab` to its
contract without a virtualenv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from minivllm.course import colab, setup_cell

ROOT = Path(__file__).resolve().parents[2]

# What Colab has before the setup cell runs (a subset of its image: what minivllm or the
# notebooks could lean on without saying so). The setup cell installs the rest from the course's
# runtime dependencies.
COLAB_PREINSTALLED = ["torch", "triton", "numpy", "matplotlib", "transformers", "tokenizers", "safetensors",
                      "huggingface_hub", "tqdm", "ipywidgets", "ipykernel", "nbclient", "nbformat"]

FAKE_COLAB = {
    "google/colab/__init__.py": "from . import drive, files  # noqa: F401\n",
    "google/colab/drive.py": '''
import os


def mount(mountpoint, force_remount=False):
    """Colab asks for consent, then mounts the student's Drive; here a folder that outlives the
    runtime stands in for it."""
    store = os.environ["FAKE_DRIVE_STORE"]
    os.makedirs(os.path.join(store, "MyDrive"), exist_ok=True)
    if not os.path.islink(mountpoint):
        os.makedirs(os.path.dirname(mountpoint), exist_ok=True)
        os.symlink(store, mountpoint)
    print("Mounted at", mountpoint)
''',
    "google/colab/files.py": '''
def download(path):
    print("download", path)


def upload():
    raise RuntimeError("no browser here")
''',
}

RUN_NOTEBOOK = '''
import sys

import nbformat
from nbclient import NotebookClient

path, cwd, cells = sys.argv[1], sys.argv[2], sys.argv[3]
nb = nbformat.read(path, as_version=4)
code = [c for c in nb.cells if c.cell_type == "code"]
if cells == "setup":
    nb.cells = code[:1]
nb.cells.insert(0, nbformat.v4.new_code_cell("import google.colab  # Colab's kernel has it loaded"))
NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
for cell in nb.cells:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            print(out["text"], end="")
print("NOTEBOOK DONE")
'''


# --- the whole session, in a new virtualenv ----------------------------------------------------
@pytest.fixture(scope="module")
def session(tmp_path_factory):
    base = tmp_path_factory.mktemp("colab")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pins = [f"{name}=={version(name)}" for name in COLAB_PREINSTALLED]
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-3000:]
    published = _publish(base / "published")
    fake = base / "fake"
    for rel, text in FAKE_COLAB.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    (base / "runner.py").write_text(RUN_NOTEBOOK)
    return types.SimpleNamespace(base=base, python=python, published=published, fake=fake,
                                 drive=base / "drive-store")


def _publish(repo: Path) -> Path:
    """The course's tracked files as a repository with its release tagged: what the setup cell
    fetches over file:// instead of from the published address."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@localhost"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "release"], cwd=repo, check=True)
    subprocess.run([*git, "tag", setup_cell.RELEASE], cwd=repo, check=True)
    return repo


def _open_in_colab(env: types.SimpleNamespace, runtime: str, notebook: str, cells: str) -> str:
    """Open ``notebook`` as Colab does (a copy on its own, its setup cell pointing at the local
    repository) in runtime folder ``runtime``; run ``cells`` ("all" or "setup")."""
    content = env.base / runtime
    opened = content / "opened"
    opened.mkdir(parents=True, exist_ok=True)
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    for cell in nb["cells"]:
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        cell["source"] = text.replace(setup_cell.REPO_URL, f"file://{env.published}")
    (opened / notebook).write_text(json.dumps(nb))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MINIVLLM_", "PYTHON", "VIRTUAL_ENV"))}
    environ.update(PYTHONPATH=str(env.fake), FAKE_DRIVE_STORE=str(env.drive),
                   MINIVLLM_COLAB_CONTENT=str(content), PATH=f"{env.python.parent}:{os.environ['PATH']}")
    run = subprocess.run([str(env.python), str(env.base / "runner.py"), str(opened / notebook), str(opened), cells],
                         capture_output=True, text=True, env=environ, timeout=1500)
    assert run.returncode == 0 and "NOTEBOOK DONE" in run.stdout, (run.stdout + run.stderr)[-4000:]
    return run.stdout


def test_a_colab_session_keeps_the_students_work_across_a_recycled_runtime(session):
    first = _open_in_colab(session, "content-1", "00_setup_and_tour.ipynb", "all")
    assert "kept on Drive from now on" in first, first[-3000:]
    course_dir = session.base / "content-1" / "minivllm"
    assert (course_dir / ".git").is_dir()
    tags = subprocess.run(["git", "describe", "--tags"], cwd=course_dir, capture_output=True, text=True).stdout
    assert tags.strip() == setup_cell.RELEASE  # the pinned release, not whatever main holds
    mine = course_dir / "exercises" / "ex00_kv_memory.py"
    assert mine.resolve().is_relative_to(session.drive.resolve())  # the file lives on "Drive"
    mine.write_text(mine.read_text() + "\n# my work, written in the first runtime\n")

    shutil.rmtree(session.base / "content-1", ignore_errors=True)  # the runtime is recycled
    assert (session.drive / "MyDrive" / "minivllm-work" / "exercises" / "ex00_kv_memory.py").exists()

    second = _open_in_colab(session, "content-2", "00_setup_and_tour.ipynb", "setup")
    assert "back from Drive" in second, second[-3000:]
    again = session.base / "content-2" / "minivllm" / "exercises" / "ex00_kv_memory.py"
    assert again.read_text().endswith("# my work, written in the first runtime\n")


# --- minivllm.course.colab alone ---------------------------------------------------------------
@pytest.fixture()
def fake_drive(tmp_path, monkeypatch):
    """``google.colab.drive.mount`` as Colab's: it makes ``<mount>/MyDrive`` appear."""
    store = tmp_path / "store"
    mounts = []

    def mount(mountpoint, force_remount=False):
        (store / "MyDrive").mkdir(parents=True, exist_ok=True)
        Path(mountpoint).parent.mkdir(parents=True, exist_ok=True)
        Path(mountpoint).symlink_to(store, target_is_directory=True)
        mounts.append(mountpoint)

    google = types.ModuleType("google")
    google_colab = types.ModuleType("google.colab")
    google_colab.drive = types.SimpleNamespace(mount=mount)
    google.colab = google_colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", google_colab)
    return mounts


def _course(folder: Path) -> Path:
    (folder / "exercises").mkdir(parents=True)
    for name in ("ex00_kv_memory.py", "ex02_continuous.py"):
        (folder / "exercises" / name).write_text(f"# stub of {name}\n")
    return folder


def test_keep_work_mounts_drive_keeps_edits_and_adds_new_exercises(tmp_path, fake_drive):
    work = tmp_path / "content" / "drive" / "MyDrive" / "minivllm-work"
    first = _course(tmp_path / "run1")
    kept = colab.keep_work(first, work)
    assert fake_drive == [str(tmp_path / "content" / "drive")]
    (first / "exercises" / "ex02_continuous.py").write_text("# mine\n")
    assert colab.keep_work(first, work) == kept  # a second run of the cell changes nothing

    second = _course(tmp_path / "run2")  # a new runtime, and a release with one more exercise
    (second / "exercises" / "ex03_chunked_prefill.py").write_text("# new stub\n")
    colab.keep_work(second, work)
    assert (second / "exercises").is_symlink()
    assert (second / "exercises" / "ex02_continuous.py").read_text() == "# mine\n"  # never overwritten
    assert (second / "exercises" / "ex03_chunked_prefill.py").read_text() == "# new stub\n"
    assert (second / "exercises.release" / "ex02_continuous.py").read_text() == "# stub of ex02_continuous.py\n"


def test_without_drive_the_work_stays_and_the_cell_says_how_to_keep_it(tmp_path, capsys, monkeypatch):
    course = _course(tmp_path / "run")
    assert colab.keep_work(course, None) == course / "exercises"
    assert "save_work()" in capsys.readouterr().out

    def refuse(mountpoint, force_remount=False):
        raise ValueError("mount failed")

    google_colab = types.ModuleType("google.colab")
    google_colab.drive = types.SimpleNamespace(mount=refuse)
    monkeypatch.setitem(sys.modules, "google.colab", google_colab)
    colab.keep_work(course, tmp_path / "content" / "drive" / "MyDrive" / "w")
    printed = capsys.readouterr().out
    assert "could not be mounted" in printed and "save_work()" in printed
    assert not (course / "exercises").is_symlink()


def test_save_and_restore_work_round_trip_and_refuse_paths_outside_exercises(tmp_path):
    course = _course(tmp_path / "run")
    (course / "exercises" / "ex02_continuous.py").write_text("# mine\n")
    (course / "exercises" / "notes.txt").write_text("not an exercise")
    saved = colab.save_work(course, tmp_path / "work.zip")
    assert sorted(zipfile.ZipFile(saved).namelist()) == ["exercises/ex00_kv_memory.py",
                                                         "exercises/ex02_continuous.py"]
    fresh = _course(tmp_path / "run2")
    assert colab.restore_work(saved, fresh) == ["ex00_kv_memory.py", "ex02_continuous.py"]
    assert (fresh / "exercises" / "ex02_continuous.py").read_text() == "# mine\n"

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("exercises/../../outside.py", "x")
        zf.writestr("/etc/ex99_x.py", "x")
        zf.writestr("exercises/ex05_paged_attention_ref.py", "# ok\n")
    assert colab.restore_work(evil, fresh) == ["ex05_paged_attention_ref.py"]
    assert not (tmp_path / "outside.py").exists()
    with pytest.raises(ValueError, match="path of the zip"):
        colab.restore_work(None, fresh)
