"""benchmarks/attention_kernels.py: skips cleanly without a GPU, and its bookkeeping is right.

The benchmark itself only means something on a GPU. Here we check that on CPU it exits 0 with
a clear message, and we run one tiny case through its logic (real kernels in the interpreter,
``bench_ms`` stubbed) so that a broken script is caught before someone rents a GPU for it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minivllm.attention.testing import DEFAULT_DEVICE as DEVICE

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_kernels.py"


def load_script():
    spec = importlib.util.spec_from_file_location("attention_kernels_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark would really run")
def test_main_skips_cleanly_without_cuda(capsys, tmp_path):
    bench = load_script()
    out = tmp_path / "kernels.json"
    assert bench.main(["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("SKIPPED:") and "CUDA" in printed
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark would really run")
def test_script_exits_zero_from_the_command_line():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "SKIPPED" in result.stdout


def test_peak_bandwidth_table():
    bench = load_script()
    assert bench.peak_bandwidth("NVIDIA H200") == 4.8e12
    assert bench.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert bench.peak_bandwidth("NVIDIA H100 PCIe") is None
    assert bench.peak_bandwidth("NVIDIA A100-SXM4-80GB") == 2.0e12
    assert bench.peak_bandwidth("NVIDIA L4") == 0.3e12
    assert bench.peak_bandwidth("NVIDIA L40S") is None
    assert bench.peak_bandwidth("Tesla T4") == 0.32e12
    assert bench.peak_bandwidth("NVIDIA GeForce RTX 4090") is None


def test_run_case_logic_on_cpu(monkeypatch):
    """One tiny case on CPU: the paged kernel must agree with SDPA on the same sequences, the
    byte count must be K+V of every token, and the row must hold every column of the table."""
    bench = load_script()
    monkeypatch.setattr(bench, "bench_ms", lambda fn: (fn(), 1.0)[1])
    args = bench.parse_args(["--num-heads", "4", "--num-kv-heads", "2", "--head-dim", "64", "--dtype", "float16"])
    row = bench.run_case(batch=2, context=100, args=args, peak=1e12, device=DEVICE.type)
    assert row["kv_bytes"] == 2 * 2 * 100 * 2 * 64 * 2
    assert row["max_abs_diff_vs_sdpa"] < 2e-3
    assert row["paging_cost"] == 0.0 and row["peak_fraction"] == pytest.approx(row["kv_bytes"] / 1e-3 / 1e12)
    table = bench.markdown_table([row, {"batch": 256, "context": 32768, "skipped": "needs 64 GiB"}])
    assert table.count("\n") == 3 and "skipped" in table
    json.dumps(row)  # what --out writes must be JSON-serialisable
