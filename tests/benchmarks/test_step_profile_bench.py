"""``benchmarks/step_profile.py`` times the phases of a step through an executor wrapper and a
step listener, without replacing the engine's methods: the phases account for the whole run
(timings themselves are not asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "step_profile.py"
PHASES = {"schedule", "prepare inputs", "model forward", "lm head", "sample", "update", "outputs"}


def load_script():
    spec = importlib.util.spec_from_file_location("step_profile_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_phases_cover_the_run():
    bench = load_script()
    totals, wall, tokens = bench.profile(requests=3, max_num_seqs=2)
    assert totals.pop("step") <= wall
    assert set(totals) == PHASES and all(v >= 0 for v in totals.values()), totals
    assert sum(totals.values()) == pytest.approx(wall)
    assert tokens == sum(it.output_len for it in bench.make_trace(3, 0))


def test_the_function_profile_names_the_kernels_and_the_linear_layers():
    """cProfile sees what torch.profiler cannot: the C++ kernels called through pybind."""
    from minivllm.cpu_kernels import kernel_status

    bench = load_script()
    table = bench.function_profile(requests=3, max_num_seqs=2, top=200)
    assert table.startswith("| function | calls | own time (s) | share of all |")
    assert "torch._C._nn.linear" in table
    if kernel_status() is None:  # the attention and the layer ops under the modules
        assert "minivllm_cpu_kernels.paged_attention" in table
        assert "minivllm_cpu_kernels.rms_norm" in table
