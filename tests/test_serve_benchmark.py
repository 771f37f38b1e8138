"""``benchmarks/serving.py --quick`` runs against a server and reports every rate it sent."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parent.parent


def load_benchmark():
    spec = importlib.util.spec_from_file_location("serving_benchmark", ROOT / "benchmarks" / "serving.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    bench = load_benchmark()
    values = [0.3, 0.1, 5.0, 2.0, 2.0, 0.7, 9.5]
    for q in (0, 50, 90, 99, 100):
        assert bench.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert bench.percentile([], 50) != bench.percentile([], 50)  # NaN


def test_quick_run_reports_latency_and_throughput_per_rate(tmp_path, capsys):
    bench = load_benchmark()
    out_json, out_png = tmp_path / "serving.json", tmp_path / "serving.png"
    status = bench.main(["--quick", "--in-process", "--rates", "8", "inf", "--num-requests", "6",
                         "--json", str(out_json), "--plot", str(out_png)])
    assert status == 0, capsys.readouterr().out
    rows = json.loads(out_json.read_text())
    assert [r["rate"] for r in rows] == [8.0, "inf"]
    for r in rows:
        assert r["config"] == "continuous" and r["completed"] == r["sent"] == 6 and not r["errors"]
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
        assert 0 < r["itl_p50_ms"] <= r["itl_p99_ms"]
        assert r["output_throughput"] > r["request_throughput"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "| continuous | 8 | 6/6 |" in table and "| continuous | inf | 6/6 |" in table
