"""GPU-scale serving on a CPU: the real scheduler and KV-cache manager, a roofline clock.

    from minivllm.sim import Simulator, preset
    from minivllm import workloads
    sim = Simulator(preset("llama-3-8b"), "H100-SXM", max_num_seqs=256)
    stats = sim.run(workloads.chat(500, seed=0))
    stats.summary()["output_tokens_per_s"]

See ``docs/simulator.md`` for the cost model, its assumptions and the numbers it uses.
"""

from minivllm.sim.cost_model import CostModel, StepCost
from minivllm.sim.hardware import HARDWARE, Hardware, get_hardware
from minivllm.sim.model_spec import PRESETS, ModelSpec, preset, tiny_model_spec
from minivllm.sim.simulator import Simulator

__all__ = [
    "CostModel",
    "StepCost",
    "HARDWARE",
    "Hardware",
    "get_hardware",
    "PRESETS",
    "ModelSpec",
    "preset",
    "tiny_model_spec",
    "Simulator",
]
