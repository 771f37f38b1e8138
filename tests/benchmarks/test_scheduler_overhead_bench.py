"""``benchmarks/scheduler_overhead.py`` drives minivllm's scheduler by hand (schedule, a fake
model's tokens, commit, update) to time its bookkeeping: on a small trace the run ends with every
block back in the pool and every prompt token computed once (its own asserts), for both block
sizes and with prefix caching on and off (timings themselves are not asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scheduler_overhead.py"


def load_script():
    spec = importlib.util.spec_from_file_location("scheduler_overhead_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scheduler_overhead_run_serves_a_small_trace_to_the_end(capsys):
    bench = load_script()
    elapsed, tokens, steps = bench.run_once(12, 16, 0, prefix_caching=True)
    assert elapsed > 0 and steps > 0
    assert tokens >= 12 * 100  # every request generates 100..1024 tokens, one a step
    assert bench.main(["--requests", "6", "--repeats", "1", "--block-sizes", "16", "256"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 16 ") or line.startswith("| 256 ")]
    assert len(rows) == 4
