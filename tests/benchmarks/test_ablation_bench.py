"""``benchmarks/ablation.py --quick``: every setting runs on the engine and the simulator, greedy
tokens agree where the technique is exact, the table and the JSON record have every row. Speed
is printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm.course import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ablation.py"
ablation = load_benchmark("ablation", ROOT)
NAMES = [s.name for s in ablation.settings("draft")]


def test_settings_are_cumulative_and_each_adds_one_thing():
    steps = ablation.settings("draft")
    assert [s.name for s in steps][0] == "static batching" and len(steps) == 7
    for before, after in zip(steps, steps[1:], strict=False):
        added = {k: v for k, v in after.args.items() if before.args.get(k) != v}
        assert len(added) == 1, (after.name, added)
        assert all(after.args[k] == v for k, v in before.args.items() if k not in added)
    last = steps[-1].args
    assert last["scheduler"] == "continuous" and last["kv_cache"] == "paged"
    assert last["enable_chunked_prefill"] and last["enable_prefix_caching"]
    assert last["kv_cache_dtype"] == "int8" and last["speculative_config"]["num_speculative_tokens"] > 0


def test_static_batch_is_what_max_length_regions_allow():
    assert ablation.static_batch_size(1024, 2048) == 8  # 1,024 blocks of 16 = 8 x 2,048 tokens
    assert ablation.static_batch_size(1023, 2048) == 7
    assert ablation.static_batch_size(10**6, 2048) == ablation.MAX_NUM_SEQS


def test_same_outputs_compares_within_one_kv_format():
    a, b = [[1, 2]], [[1, 3]]
    outs = dict(zip(NAMES, [a, a, a, a, a, b, b], strict=True))
    assert all(ablation.same_outputs(outs).values())
    outs[NAMES[3]] = b
    assert ablation.same_outputs(outs)[NAMES[3]] is False


@pytest.mark.slow
def test_quick_run_prints_every_row_and_stores_the_record(tmp_path):
    fig = tmp_path / "ablation.png"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--store", str(tmp_path), "--plot", str(fig)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("$ python benchmarks/ablation.py --quick")
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| setting")]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == NAMES
    assert "**differ**" not in out  # greedy tokens identical wherever the technique is exact
    assert "5-24×" in out and fig.stat().st_size > 0

    record = json.loads((tmp_path / ablation.RESULTS_NAME).read_text())
    for part in ("engine", "sim"):
        settings = record[part]["settings"]
        assert list(settings) == NAMES
        assert settings[NAMES[0]]["vs_static"] == pytest.approx(1.0)
        assert all(r["output_tokens_per_s"] > 0 for r in settings.values())
    eng, sim = record["engine"]["settings"], record["sim"]["settings"]
    assert all(record["engine"]["same_outputs"].values())
    # what each technique changes, seen in the counters (not in timings)
    for s in (eng, sim):
        assert s["static batching"]["padding_tokens"] > 0 and s["+ continuous batching"]["padding_tokens"] == 0
        assert s["+ continuous batching"]["peak_running"] <= s["static batching"]["seats"]
        assert s["+ paged KV cache"]["peak_running"] > s["+ continuous batching"]["peak_running"]
        assert s["+ prefix caching"]["prefill_tokens"] < s["+ chunked prefill"]["prefill_tokens"]
        assert s["+ int8 KV cache"]["kv_blocks"] > s["+ prefix caching"]["kv_blocks"]
        assert s["+ speculative decoding"]["acceptance_rate"] > 0
    assert record["engine"]["static_batch"] == ablation.ENGINE_MAX_LEN_SEQS
