"""The simulator makes the engine's scheduling decisions, step by step.

The same trace goes through the real engine (a real checkpoint running on the CPU) and through
the simulator (that checkpoint's shape, any GPU: time does not influence an all-at-once
trace), with the same engine arguments and the same number of KV blocks. At every step both
must schedule the same requests for the same number of tokens, in the same order, and report
the same batch and memory figures. Cases cover chunked prefill, preemption from a small pool,
the priority policy, the contiguous cache and static batching.

The engine's decisions are recorded by a step listener (``EngineCore.add_step_listener``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import minivllm
from minivllm import LLM, workloads
from minivllm.engine.core_client import local_core
from minivllm.sim import ModelSpec, Simulator
from minivllm.workloads import Trace, TraceItem

STEP_FIELDS = (
    "num_running", "num_waiting", "num_prefill_tokens", "num_decode_tokens", "num_padding_tokens",
    "kv_blocks_used", "kv_blocks_total", "tokens_stored", "slots_reserved", "num_preemptions",
    "num_batched_seqs",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The shipped tiny model once it is trained; until then a random checkpoint of the same
    family with its tokenizer (scheduling never looks at the weights)."""
    tiny = Path(minivllm.TINY_MODEL_DIR)
    if (tiny / "config.json").is_file() and any(tiny.glob("*.safetensors")):
        return tiny
    from support import save_random_checkpoint

    d = tmp_path_factory.mktemp("sim_equivalence_ckpt")
    save_random_checkpoint(d, "llama")
    return d


def run_engine(model_dir: Path, trace: Trace, engine_args: dict):
    llm = LLM(str(model_dir), **engine_args)
    engine = llm.engine
    log: list[list[tuple[str, int]]] = []
    local_core(engine).add_step_listener(lambda step: log.append(step.plan.decisions()))
    stats = workloads.run_on_engine(llm, trace)
    engine.check_invariants()
    return log, stats


def run_sim(model_dir: Path, trace: Trace, engine_args: dict):
    sim = Simulator(ModelSpec.from_pretrained(model_dir), "T4", record_decisions=True, **engine_args)
    stats = sim.run(trace, check_invariants=True)
    return sim.decisions, stats


def mixed_trace(n: int, seed: int, max_prompt: int, max_output: int) -> Trace:
    import random

    rng = random.Random(seed)
    prompts = [rng.randint(3, max_prompt) for _ in range(n)]
    outputs = [rng.randint(1, max_output) for _ in range(n)]
    return workloads.fixed(prompts, outputs, seed=seed, name=f"mix{seed}")


def prioritised_trace() -> Trace:
    """Low-priority long requests queued first, important short ones after them."""
    base = mixed_trace(8, seed=5, max_prompt=30, max_output=20)
    items = [
        TraceItem(it.request_id, 0.0, it.prompt_len, it.output_len, it.seed, priority=0 if i % 3 == 2 else 1)
        for i, it in enumerate(base)
    ]
    return Trace("prio", items)


CASES = {
    # a small token budget forces prompts to be split over several steps
    "continuous-chunked": (
        mixed_trace(9, seed=1, max_prompt=70, max_output=12),
        dict(block_size=8, num_kv_blocks=80, max_num_seqs=3, max_num_batched_tokens=24, max_model_len=128),
    ),
    # 12 blocks x 8 tokens for 6 sequences that grow to ~50 tokens: preemption by recompute
    "continuous-preempt": (
        mixed_trace(6, seed=2, max_prompt=30, max_output=30),
        dict(block_size=8, num_kv_blocks=12, max_num_seqs=6, max_num_batched_tokens=64, max_model_len=96),
    ),
    "priority-preempt": (
        prioritised_trace(),
        dict(block_size=8, num_kv_blocks=12, max_num_seqs=5, max_num_batched_tokens=40,
             max_model_len=96, scheduling_policy="priority"),
    ),
    "contiguous-unchunked": (
        mixed_trace(7, seed=3, max_prompt=40, max_output=10),
        dict(block_size=8, num_kv_blocks=24, kv_cache="contiguous", max_num_seqs=4,
             enable_chunked_prefill=False, max_model_len=64, max_num_batched_tokens=64),
    ),
    "static": (
        mixed_trace(7, seed=4, max_prompt=40, max_output=15),
        dict(block_size=8, num_kv_blocks=64, scheduler="static", max_num_seqs=3, max_model_len=96),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_engine_and_simulator_schedule_identically(model_dir, case):
    trace, engine_args = CASES[case]
    eng_log, eng_stats = run_engine(model_dir, trace, engine_args)
    sim_log, sim_stats = run_sim(model_dir, trace, engine_args)

    assert len(sim_log) == len(eng_log), f"{case}: {len(sim_log)} simulated steps vs {len(eng_log)} engine steps"
    for i, (e, s) in enumerate(zip(eng_log, sim_log, strict=True)):
        assert s == e, f"{case}: step {i} differs\n engine    {e}\n simulator {s}"
    for i, (e, s) in enumerate(zip(eng_stats.steps, sim_stats.steps, strict=True)):
        for name in STEP_FIELDS:
            assert getattr(s, name) == getattr(e, name), f"{case}: step {i} field {name}"
    for rid, em in eng_stats.requests.items():
        sm = sim_stats.requests[rid]
        assert (sm.num_output_tokens, sm.num_preemptions) == (em.num_output_tokens, em.num_preemptions), rid
    assert sim_stats.prefix_hit_rate == pytest.approx(eng_stats.prefix_hit_rate)

    # the case must exercise what its name says
    summary = sim_stats.summary()
    if "preempt" in case:
        assert summary["preemptions"] > 0
    if case == "continuous-chunked":
        # some prompt is longer than the budget, so some step carries only part of a prompt
        assert any(n < it.prompt_len for step in sim_log for rid, n in step
                   for it in trace if it.request_id == rid and n > 1)
    if case == "static":
        assert summary["padding_tokens"] > 0
