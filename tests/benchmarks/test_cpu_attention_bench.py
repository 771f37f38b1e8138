"""benchmarks/cpu_attention.py: its kernel half runs, and both backends agree on its problem.

The timings mean nothing here (a shared machine, tiny sizes); what is checked is that the script
runs end to end and that the two backends it compares compute the same attention.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from minivllm.attention.cpp_backend import kernel_status

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_attention.py"


def load_script():
    spec = importlib.util.spec_from_file_location("cpu_attention_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(kernel_status() is not None, reason=f"the cpp kernel does not build here: {kernel_status()}")
def test_kernel_half_runs_and_the_backends_agree(capsys):
    bench = load_script()
    assert bench.main(["--kernel-only", "--threads", "1", "--seqs", "6", "--context", "40"]) == 0
    printed = capsys.readouterr().out
    assert "loading the built kernel in a new process" in printed
    err = float(re.search(r"largest difference ([0-9.e+-]+)", printed).group(1))
    assert err < 1e-4
    assert re.search(r"^\| 1 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \|$", printed, re.M)


@pytest.mark.skipif(kernel_status() is not None, reason=f"the cpp kernel does not build here: {kernel_status()}")
def test_engine_rows_compare_the_backends_with_identical_outputs():
    """The two CPU backends over a few requests one at a time: the row names each engine's
    figure and every output is the same."""
    bench = load_script()
    header, _, row = bench.engine_rows([1], rounds=1, requests=3, one_at_a_time=True)
    assert "'torch' output tok/s | 'cpp' output tok/s" in header
    assert re.fullmatch(r"\| 1 \| [0-9]+ \| [0-9]+ \| [0-9.]+x \| [0-9.]+x \| 3/3 \|", row)
