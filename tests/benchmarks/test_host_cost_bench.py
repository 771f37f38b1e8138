"""``benchmarks/host_cost.py``: the host side of a step at a real model's structure, beside the
device's floor at a T4's and an H100's peak. Checked small and fast: the kernels are counted and
put back, the byte count is the one worked out by hand, the verdict follows host against device
(timings themselves are not asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "host_cost.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("host_cost_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_rows_and_verdict(bench):
    rows = bench.measure(models=("qwen3-0.6b",), batches=(1, 4), repeats=1)
    assert [(r.step, r.batch) for r in rows] == [("decode", 1), ("decode", 4), ("mixed", 1), ("mixed", 4)]
    for r in rows:
        assert r.host_ms > 0 and r.host_per_layer_us > 0 and r.launches > 28 * 10  # 28 layers, >10 kernels each
        assert set(r.memory_ms) == {"T4", "H100"} and r.memory_ms["T4"] > r.memory_ms["H100"]
        for gpu, ms in r.memory_ms.items():
            assert r.verdict[gpu] == ("launch-bound" if r.host_ms > ms else "device-bound")
    lines = bench.verdict(rows)
    assert len(lines) == 2 and lines[0].startswith("qwen3-0.6b on T4: decode is")
    speedup = bench.graph_speedup(rows, "H100")
    assert all(s >= 1 for s in speedup.values())
    assert "| qwen3-0.6b | decode | 1 | 1 |" in bench.markdown(rows)


def test_kernels_are_counted_then_put_back(bench):
    from minivllm.attention import triton_decode

    kernel = triton_decode._paged_decode_kernel
    counts: dict[str, int] = {}
    backend, restore = bench.triton_backend_without_launches(counts)
    try:
        cfg = bench.shrunk(bench.model_config("qwen3-0.6b"))
        runner = bench.build_runner(cfg, backend)
        logits = bench.run_step(runner, bench.make_step(1, 1024, 0, 512))
        assert logits.shape == (1, 512) and logits.device.type == "cpu"
        # batch 1, 8 KV heads, 65 blocks: split-KV (8 splits), so per layer the cache write,
        # the split kernel and the merge
        assert counts == {"_reshape_and_cache_kernel": 28, "_paged_decode_kernel": 28, "_merge_splits_kernel": 28}
    finally:
        restore()
    assert triton_decode._paged_decode_kernel is kernel


def test_step_bytes_by_hand(bench):
    from minivllm.sim.model_spec import preset

    spec = preset("qwen3-0.6b")
    # Qwen3-0.6B: 28 layers of q/k/v/o (1024x2048, 2x 1024x1024, 2048x1024) and MLP (3x 1024x3072),
    # the tied 151936x1024 LM head, norms; KV 2 x 28 x 8 x 128 x 2 bytes per token
    linear = 28 * (1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 3 * 1024 * 3072)
    norms = 28 * (2 * 1024 + 2 * 128) + 1024
    kv = 2 * 28 * 8 * 128 * 2
    assert spec.kv_bytes_per_token() == kv
    assert bench.step_bytes(spec, 8, 1000) == 2 * (linear + norms + 151936 * 1024) + 8 * 1000 * kv + 8 * kv
    assert bench.device_ms(spec, "H100", 8, 1000) == pytest.approx(bench.step_bytes(spec, 8, 1000) / 3.35e9)


def test_faithfulness_check_runs(bench, monkeypatch):
    monkeypatch.setattr(bench, "CONTEXT", 64)
    times = bench.faithfulness(repeats=1)
    assert set(times) == {"decode 8", "decode 256", "mixed 256"}
    assert times["decode 8"]["meta"] > 0 and all(t["ratio"] > 0 for t in times.values())
    assert torch.get_default_device().type == "cpu"
