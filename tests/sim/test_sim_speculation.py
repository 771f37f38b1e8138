"""Speculative decoding in the simulator: the engine's scheduler and core, acceptances drawn at a
given rate, the draft model's passes and memory priced on the roofline."""

from __future__ import annotations

import math

import pytest

from minivllm import workloads
from minivllm.sim import CostModel, Simulator, get_hardware, preset

TARGET = preset("llama-3-70b", weight_dtype="int4", kv_dtype="int8")
DRAFT = preset("llama-3-8b", weight_dtype="int4", kv_dtype="int8")
H100 = get_hardware("H100-SXM")


def simulate(trace, speculative_config=None, acceptance_rate=None, **kw):
    sim = Simulator(TARGET, H100, max_model_len=4096, speculative_config=speculative_config,
                    acceptance_rate=acceptance_rate, **kw)
    sim.run(trace, check_invariants=True)
    return sim


def draft_config(k: int = 4, model=DRAFT) -> dict:
    return {"model": model, "num_speculative_tokens": k}


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 1.0])
def test_drafts_are_kept_up_to_the_first_rejection_at_the_given_rate(a):
    """Each draft accepted with probability a until the first rejection: of k = 4 verified
    drafts, sum_j a^j are kept on average (the truncated geometric law)."""
    k = 4
    sim = simulate(workloads.fixed([64] * 8, 400), {"method": "ngram", "num_speculative_tokens": k}, a)
    s = sim.summary()
    kept = sum(a**j for j in range(1, k + 1))
    assert s["spec_draft_tokens"] > 300
    assert s["spec_acceptance_rate"] == pytest.approx(kept / k, abs=0.03)
    assert s["spec_mean_accepted_length"] == pytest.approx(1 + kept, abs=0.12)
    assert s["output_tokens"] == 8 * 400  # every request ends at its own length, drafts or not


def test_a_verification_costs_little_more_than_a_decode_at_batch_1_and_drafts_cost_their_passes():
    """One request, every draft accepted (a = 1, so each step is exactly k + 1 tokens): a step's
    time is the target's pass over k + 1 rows (the LM head on each) plus k passes of the draft,
    priced by the cost model itself."""
    k, prompt, out = 4, 512, 101  # 1 token from the prompt, then (nearly) 20 steps of 5
    trace = workloads.fixed([prompt], out)
    plain = simulate(trace)
    ngram = simulate(trace, {"method": "ngram", "num_speculative_tokens": k}, 1.0)
    draft = simulate(trace, draft_config(k), 1.0)
    target, small = CostModel(TARGET, H100), CostModel(DRAFT, H100)
    assert [s.num_decode_tokens for s in draft.stats.steps[1:19]] == [k + 1] * 18

    i = 10  # step i verifies k drafts after 512 + (k + 1) * (i - 1) cached tokens
    step, context = draft.step_costs[i], prompt + (k + 1) * (i - 1)
    want_target = target.step_cost([(context, k + 1, k + 1)])
    assert step.flops == pytest.approx(want_target.flops)
    # the draft's passes: the one or two tokens the verification added, then k - 1 single rows
    first = small.step_cost([(context + k, 2, 1)]).time
    later = sum(small.step_cost([(context + k + 2 + j - 1, 1, 1)]).time for j in range(1, k))
    assert step.draft_time == pytest.approx(first + later, rel=1e-9)
    # at batch 1 the step is a pass over the weights: five rows cost about one
    one_row = target.step_cost([(context, 1, 1)]).time
    assert want_target.time < 1.02 * one_row

    per_token = {name: sim.stats.steps[-1].start_time / out for name, sim in
                 (("plain", plain), ("ngram", ngram), ("draft", draft))}
    assert per_token["ngram"] < per_token["plain"] / 3.5  # 5 tokens a step, each ~ one decode
    assert per_token["ngram"] < per_token["draft"] < per_token["plain"] / 1.5


def test_at_a_saturated_batch_rejected_drafts_cost_real_work():
    """At batch 64 a step is compute-bound: verifying 4 drafts that are all rejected makes every
    step about 5 decodes' work, so speculation that never hits is slower per token than none."""
    trace = workloads.fixed([256] * 64, 64)
    plain = simulate(trace, max_num_seqs=64)
    missed = simulate(trace, {"method": "ngram", "num_speculative_tokens": 4}, 0.0, max_num_seqs=64)
    assert missed.summary()["spec_acceptance_rate"] == 0
    assert missed.summary()["mean_tpot_s"] > 1.5 * plain.summary()["mean_tpot_s"]
    assert max(c.bound == "compute" for c in missed.step_costs)


def test_the_draft_model_takes_its_weights_and_kv_from_the_pool():
    plain = Simulator(TARGET, H100, max_model_len=4096)
    with_draft = Simulator(TARGET, H100, max_model_len=4096, speculative_config=draft_config(), acceptance_rate=0.5)
    assert with_draft.kv_block_bytes == pytest.approx(
        (TARGET.kv_bytes_per_token() + DRAFT.kv_bytes_per_token()) * with_draft.args.block_size)
    assert with_draft.kv_memory_from_hardware() == pytest.approx(plain.kv_memory_from_hardware() - DRAFT.weight_bytes)
    assert with_draft.num_kv_blocks == math.floor(with_draft.kv_memory_from_hardware() / with_draft.kv_block_bytes)
    # a preset name works too; the engine argument int8 makes both caches int8
    named = Simulator(preset("llama-3-8b"), H100, max_model_len=4096, kv_cache_dtype="int8",
                      speculative_config={"model": "llama-3-8b", "num_speculative_tokens": 2}, acceptance_rate=0.5)
    assert named.draft_model.kv_dtype == "int8" and named.draft_model.name == "llama-3-8b"
    # as minivllm serve passes it: JSON text
    as_json = Simulator(TARGET, H100, max_model_len=4096, acceptance_rate=0.5,
                        speculative_config='{"model": "llama-3-8b", "num_speculative_tokens": 4}')
    assert as_json.draft_model.name == "llama-3-8b" and as_json.num_kv_blocks < plain.num_kv_blocks


def test_preemption_and_lookahead_with_drafts_keep_the_books():
    """A pool so small that requests are preempted while they speculate: every request still
    ends at its length, every block comes back, the invariants hold after every step."""
    trace = workloads.chat(40, seed=3)
    sim = simulate(trace, draft_config(3), 0.6, num_kv_blocks=260, max_num_seqs=32)
    s = sim.summary()
    assert s["preemptions"] > 0
    assert s["output_tokens"] == sum(it.output_len for it in trace)
    assert sim.kv.num_free_blocks == sim.kv.num_blocks


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"acceptance_rate": 0.5}, ValueError, "go together"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}, ValueError, "go together"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}, "acceptance_rate": 1.5},
     ValueError, r"acceptance_rate must be in \[0, 1\].*1.5"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}, "acceptance_rate": float("nan")},
     ValueError, "acceptance_rate"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}, "acceptance_rate": "0.5"},
     TypeError, "acceptance_rate must be a number"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}, "acceptance_rate": True},
     TypeError, "acceptance_rate must be a number"),
    ({"speculative_config": {"model": "no-such-model", "num_speculative_tokens": 4}, "acceptance_rate": 0.5},
     ValueError, "unknown model preset 'no-such-model'"),
    ({"speculative_config": {"model": 3, "num_speculative_tokens": 4}, "acceptance_rate": 0.5},
     ValueError, "needs 'model'"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 99}, "acceptance_rate": 0.5},
     ValueError, "num_speculative_tokens"),
])
def test_bad_speculation_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        Simulator(TARGET, H100, max_model_len=4096, **kwargs)
