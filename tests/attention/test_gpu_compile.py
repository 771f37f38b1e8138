"""The kernels compile for T4 (sm_75), A100 (sm_80) and H100/H200 (sm_90), fit their shared
memory and spill no register, checked on a machine without a GPU (see gpu_compile_check.py).
The table of what each case uses is printed (``pytest -s``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("gpu_compile_check.py")
# Largest shared memory one block may use (opt-in), bytes.
MAX_SHARED = {75: 64 * 1024, 80: 163 * 1024, 90: 227 * 1024}
MAX_REGISTERS = 255  # per thread, every NVIDIA GPU since Kepler


def test_kernels_compile_for_nvidia_gpus():
    pytest.importorskip("triton.backends.nvidia")
    root = str(Path(__file__).resolve().parents[2])  # this checkout's minivllm, not an installed one
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(records) >= 18  # 10 float-cache cases, 8 of the int8 cache
    assert {r['kernel'] for r in records} >= {"decode", "prefill", "merge", "cache", "cache_int8"}
    failures = [r for r in records if "error" in r]
    assert not failures, "\n".join(f"{r['kernel']} {r['params']} sm_{r['capability']}: {r['error']}" for r in failures)
    print("\nkernel      params                               sm  shared  registers  spilled")
    for r in records:
        print(f"{r['kernel']:<11} {str(r['params']):<36} {r['capability']}  {r['shared_bytes'] / 1024:5.1f}K"
              f"  {r['registers']:>9}  {r['spill_bytes']:>7}")
    for r in records:
        assert r["shared_bytes"] <= MAX_SHARED[r["capability"]], r
        assert 0 < r["registers"] <= MAX_REGISTERS, r
    spilled = [r for r in records if r["spill_bytes"]]
    assert not spilled, "registers spilled to local memory:\n" + "\n".join(
        f"{r['kernel']} {r['params']} sm_{r['capability']}: {r['registers']} registers, {r['spill_bytes']} bytes spilled"
        for r in spilled)
