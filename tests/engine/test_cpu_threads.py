"""The engine's torch threads on a CPU: the cores the machine has free when it is built."""

from __future__ import annotations

import torch

from minivllm import LLM
from minivllm.engine import cpu_threads


def test_free_cores_become_threads(monkeypatch):
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 4)
    monkeypatch.setattr(cpu_threads, "TORCH_DEFAULT_THREADS", 4)
    assert cpu_threads.free_cpu_threads(busy=0.0) == 4
    assert cpu_threads.free_cpu_threads(busy=0.2) == 4  # a core used under a quarter counts as free
    assert cpu_threads.free_cpu_threads(busy=0.5) == 3
    assert cpu_threads.free_cpu_threads(busy=2.9) == 1
    assert cpu_threads.free_cpu_threads(busy=7.0) == 1  # never fewer than one
    monkeypatch.setattr(cpu_threads, "TORCH_DEFAULT_THREADS", 2)  # nor more than torch's default
    assert cpu_threads.free_cpu_threads(busy=0.0) == 2


def test_without_proc_stat_torch_default_stays(monkeypatch):
    monkeypatch.setattr(cpu_threads, "machine_cpu_seconds", lambda: None)
    assert cpu_threads.busy_cores(0.01) is None
    assert cpu_threads.free_cpu_threads() == min(cpu_threads.TORCH_DEFAULT_THREADS, cpu_threads.usable_cpus())


def test_busy_cores_is_a_measurement_of_others():
    busy = cpu_threads.busy_cores(0.05)
    assert busy is None or 0.0 <= busy <= cpu_threads.usable_cpus() + 0.5


def test_the_engine_takes_what_it_is_told_or_what_is_free(monkeypatch):
    before = torch.get_num_threads()
    try:
        LLM(cpu_threads=1, num_kv_blocks=16, max_model_len=64)
        assert torch.get_num_threads() == 1
        monkeypatch.setattr("minivllm.engine.core_builder.free_cpu_threads", lambda: 2)
        LLM(num_kv_blocks=16, max_model_len=64)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
