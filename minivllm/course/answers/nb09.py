"""Notebook 09's answers: reasoning models."""

from __future__ import annotations

from minivllm.course.answers import question


@question("nb09.same_rank", "a preempted reasoning request, older than a running reasoning request: may it "
          "push that one out? What happens, step after step, if it may?")
def same_rank() -> str:
    from minivllm.sim import CostModel, get_hardware, preset

    stack = preset("llama-3-70b", weight_dtype="int4", kv_dtype="int8")
    cost = CostModel(stack, get_hardware("H100-SXM"))
    chain, budget = 20_000, 2048
    chunks = [(done, min(budget, chain - done), done + budget >= chain) for done in range(0, chain, budget)]
    recompute = sum(cost.step_cost([c]).time for c in chunks)
    return (
        "**No: only across ranks, never within one.** Within a rank nothing is gained by the swap: "
        "one chain of the same importance runs instead of another, and the one pushed out loses its "
        "whole KV cache. Step after step, if it may: the pushed-out chain waits, the pool fills "
        "again as the chains grow, someone is preempted, and the chains of one rank keep evicting "
        "each other, every eviction throwing away a cache that must be recomputed from the prompt "
        "and every token generated so far. The pool is busy recomputing instead of decoding "
        "(thrashing), and none of them finishes sooner.\n\n"
        f"What one such eviction costs on the notebook's stack (Llama-3-70B, 4-bit weights, 8-bit KV, "
        f"H100): recomputing a {chain:,}-token chain takes {len(chunks)} steps of up to {budget:,} "
        f"tokens, {recompute:.1f} s of GPU time (the simulator's cost model), paid for nothing. "
        "Letting a *more important* request in (chat before reasoning) is worth that price: its "
        "user waits less. That is why `may_preempt` compares ranks, not whole waiting keys. "
        "minivllm's `PriorityPolicy` compares whole keys, `(priority, arrival)`, so an older "
        "request of the same priority may push a newer one out, as vLLM V0's priority scheduler "
        "(`_schedule_priority_preemption`) did. vLLM V1 lets no waiting request push a running one "
        "out: a waiting request that cannot get its blocks stops admission for that step, and "
        "preemption happens only when a running request cannot grow, the victim then being the "
        "lowest-priority running request (of those, the latest to arrive)."
    )
