"""``benchmarks/mixed_steps.py``: ``--quick`` runs as a script and prints every table; its step
builder feeds the model the step it claims to (timings themselves are not asserted)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "mixed_steps.py"


def load_script():
    spec = importlib.util.spec_from_file_location("mixed_steps_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_output() -> str:
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def table_rows(text: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    return [r for r in rows if r[0] not in ("backend", "scenario")]


def test_quick_prints_the_command_and_both_tables(quick_output):
    assert quick_output.splitlines()[0] == "$ python benchmarks/mixed_steps.py --quick"
    rows = table_rows(quick_output)
    mixed = [r for r in rows if r[0] in ("torch", "torch_padded")]
    assert [(r[0], r[1], r[2]) for r in mixed] == [("torch", "256", "7"), ("torch_padded", "256", "7")]
    for r in mixed:
        prompt, decodes, both, ratio = (float(x) for x in r[3:7])
        assert ratio == pytest.approx(both / (prompt + decodes), rel=0.02, abs=0.011)  # times rounded
        assert r[7] == ("ok" if ratio <= 1.5 else "over")
    scenarios = [r for r in rows if "prompt" in r[0]]
    assert [r[0] for r in scenarios] == [
        "one 200-token prompt", "one 200-token prompt + 7 short (77 tokens)", "eight 200-token prompts"]
    for r in scenarios:
        assert float(r[1]) > 0 and float(r[2]) > 0 and re.fullmatch(r"\d+\.\dx", r[3])


def test_verdict_and_padding_estimate():
    bench = load_script()
    assert bench.verdict(0.3, 0.1, 0.1) == (pytest.approx(1.5), "ok")
    assert bench.verdict(0.31, 0.1, 0.1)[1] == "over"
    # a 1,000-token prompt next to 63 decodes: 64 rows of 1,000 queries over 1,000+ keys
    shape = bench.StepShape([(1, 300)] * 63 + [(1000, 0)])
    assert bench.padded_bytes(shape, num_heads=6) == 3 * 4 * 64 * 6 * 1000 * 1000
    assert shape.num_tokens == 1063


def test_mixed_step_computes_the_same_prompt_as_the_prompt_alone():
    """The benchmark's mixed step is a real step: the prompt's hidden states next to decodes
    equal those of the prompt alone, for both backends."""
    bench = load_script()
    for backend in bench.BACKENDS:
        runner = bench.ForwardStep(backend, num_blocks=128)
        with torch.inference_mode():
            ids, pos, meta, last = runner.inputs(bench.prompt_step(40))
            alone = runner.model(ids, pos, meta)
            ids, pos, meta, last = runner.inputs(bench.mixed_step(40, 3))
            mixed = runner.model(ids, pos, meta)
        assert pos[-40:].tolist() == list(range(40)) and last[-1] == ids.shape[0] - 1
        torch.testing.assert_close(mixed[-40:], alone, atol=1e-4, rtol=1e-4)
        with pytest.raises(ValueError, match="KV blocks"):
            runner.inputs(bench.mixed_step(2000, 3))


def test_forward_step_takes_the_device_and_dtype():
    """Notebook 05 times on its DEVICE / DTYPE: the step's model, cache and inputs follow them."""
    bench = load_script()
    runner = bench.ForwardStep("torch", num_blocks=64, device="cpu", dtype=torch.bfloat16)
    assert runner.device == torch.device("cpu") and runner.model.lm_head.weight.dtype == torch.bfloat16
    ids, pos, meta, _ = runner.inputs(bench.mixed_step(20, 2))
    assert ids.device == pos.device == meta.seq_lens.device == runner.device
    runner.run(bench.mixed_step(20, 2))
