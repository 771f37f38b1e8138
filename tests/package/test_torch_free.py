"""The scheduler, the KV cache manager, the engine core and the simulator need no torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_core_and_simulator_import_and_run_without_torch():
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # any attempt to import torch now raises ImportError
        sys.modules["triton"] = None
        import minivllm, minivllm.core, minivllm.sim, minivllm.config, minivllm.core.engine_core
        from minivllm import workloads
        from minivllm.sim import ModelSpec, Simulator
        spec = ModelSpec.from_pretrained(minivllm.TINY_MODEL_DIR)
        sim = Simulator("llama-3-8b", "H100-SXM", max_num_seqs=32)
        stats = sim.run(workloads.chat(40, seed=0))
        assert stats.summary()["output_tokens"] == workloads.chat(40, seed=0).num_output_tokens
        loaded = sorted(m for m, mod in sys.modules.items() if mod is not None and m.startswith(("torch", "triton")))
        print("ok", spec.num_layers, loaded)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ok ") and run.stdout.rstrip().endswith("[]"), run.stdout
