"""The GPU run's plumbing, checked where there is no GPU: ``scripts/gpu_check.sh --dry-run``, the
stored kernel benchmark that notebooks read, and the bfloat16 rule of the kernel tests."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from minivllm.course.kernel_results import (
    KernelBenchmark,
    result_name,
    store_kernel_benchmark,
    stored_kernel_benchmark,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ["env", "kernels", "ex06", "engine", "attn_bench", "traffic", "graphs", "throughput", "notebooks"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_prints_the_plan_within_budget(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"))
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    limits = {name: int(s) for name, s in re.findall(r"^(\w+) +limit +(\d+)s", printed, flags=re.M)}
    assert list(limits) == STEPS, printed
    assert all(s > 0 for s in limits.values()) and sum(limits.values()) <= 8 * 60
    assert printed.count("would run: ") == len(STEPS)
    assert "tests/attention" in printed and "--nbval-lax --nbval-current-env notebooks" in printed
    assert "benchmarks/attention_kernels.py" in printed and "benchmarks/throughput.py" in printed
    assert "benchmarks/kernel_traffic.py" in printed and "benchmarks/graph_decode.py" in printed
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "dry run: nothing ran" in summary
    for step in STEPS:
        assert f"| {step} | {limits[step]} s |" in summary
    if not torch.cuda.is_available():  # what this machine lacks is named, with the reason
        assert "missing here: gpu" in printed
        assert "CPU build" in summary or "sees no GPU" in summary
    assert not list((tmp_path / "out").glob("*.log")), "a dry run runs nothing"


def test_a_wrong_option_is_refused(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "--fast"], env=dict(os.environ, OUT=str(tmp_path)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown option --fast" in result.stderr


def record(device: str, measured_at: str, costs: list[float]) -> dict:
    rows = [dict(batch=8, context=512 * (i + 1), paged_ms=1.0, contiguous_ms=1.0 / (1 + c), paging_cost=c,
                 peak_fraction=0.5 + i / 10) for i, c in enumerate(costs)]
    rows.append(dict(batch=256, context=32768, skipped="needs ~120 GiB, 70 GiB free"))
    return dict(device=device, measured_at=measured_at, peak_bandwidth_Bps=3.35e12, torch="2.13.0",
                triton="3.9.0", cuda="12.8", config=dict(dtype="bfloat16", block_size=16), rows=rows)


def test_stored_kernel_benchmark(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    assert stored_kernel_benchmark(root=tmp_path) is None, "nothing stored: None"
    path = store_kernel_benchmark(record("NVIDIA H100 80GB HBM3", "2026-11-02", [0.02, 0.05, -0.01]), results)
    assert path.name == result_name("NVIDIA H100 80GB HBM3") == "attention_kernels-nvidia-h100-80gb-hbm3.json"
    store_kernel_benchmark(record("Tesla T4", "2026-12-01", [0.08]), results)

    latest = stored_kernel_benchmark(root=tmp_path)
    assert latest.device == "Tesla T4", "without a device: the most recent measurement"
    h100 = stored_kernel_benchmark("NVIDIA H100 80GB HBM3", root=tmp_path)
    assert isinstance(h100, KernelBenchmark) and h100.versions["cuda"] == "12.8"
    assert len(h100.measured) == 3, "the skipped case is not a measurement"
    assert h100.paging_cost() == (0.02, 0.05)
    assert h100.best_peak_fraction() == pytest.approx(0.7)
    sentence = h100.describe()
    assert "NVIDIA H100 80GB HBM3" in sentence and "+2.0%" in sentence and "+5.0%" in sentence
    assert "70% of peak" in sentence and "2026-11-02" in sentence
    assert stored_kernel_benchmark("NVIDIA A100-SXM4-80GB", root=tmp_path) is None


def test_a_broken_record_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="needs a 'device'"):
        store_kernel_benchmark({"rows": []}, tmp_path)
    with pytest.raises(ValueError, match="no letters or digits"):
        result_name("  ")
    bad = tmp_path / "benchmarks" / "results" / "attention_kernels-x.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="attention_kernels-x.json is not a kernel benchmark record"):
        stored_kernel_benchmark(root=tmp_path)


def test_bfloat16_cases_are_skipped_below_sm80(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "kernels_conftest", Path(__file__).resolve().parents[1] / "attention" / "conftest.py")
    kernels_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels_conftest)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "7.5" in kernels_conftest._without_bf16()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert kernels_conftest._without_bf16() is None
