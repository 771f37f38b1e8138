"""A small run of ``benchmarks/soak.py``: good requests keep their tokens under preemption,
aborts, abandoned streams, refused and failing neighbours; nothing is left behind."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def load_soak():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
    spec = importlib.util.spec_from_file_location("soak_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_soak(policy):
    r = load_soak().soak(60, seed=3, policy=policy, verbose=False)
    assert r["mismatched"] == 0
    assert r["kv_blocks_left"] == 0 and r["entries_left"] == 0 and r["bad_accepted"] == 0
    assert r["refused"] > 0 and r["failed"] > 0 and r["aborted"] > 0 and r["poisoned_failed"]
    assert r["preemptions"] > 0 and r["prefix_hit_tokens"] > 0
