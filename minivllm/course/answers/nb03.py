"""Notebook 03's answers: chunked prefill and preemption."""

from __future__ import annotations

from minivllm.course.answers import question


@question("nb03.preempt", "the pool is empty and a running request needs a block: under first come, first "
          "served, who gives memory back, what if it is the one asking, and what becomes of its tokens?")
def preempt() -> str:
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.core.scheduler import Scheduler, SchedulerConfig
    from minivllm.request import Request
    from minivllm.sampling_params import SamplingParams

    blocks, block_size, prompt_len, output_len = 3, 16, 8, 16
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32,
                             enable_chunked_prefill=True)
    sched = Scheduler(config, KVCacheManager(num_blocks=blocks, block_size=block_size, enable_caching=False))
    for rid in "ab":
        sched.add_request(Request(rid, list(range(1, prompt_len + 1)),
                                  SamplingParams(max_tokens=output_len, ignore_eos=True)))
    preempted_at = recomputed = back_at = None
    step = 0
    while sched.has_unfinished_requests():
        plan = sched.schedule()
        if plan.preempted and preempted_at is None:
            preempted_at, victim = step, plan.preempted[0].request_id
            asking = [rid for rid, _ in plan.decisions()]
        if preempted_at is not None and back_at is None and dict(plan.decisions()).get(victim, 0) > 1:
            back_at, recomputed = step, dict(plan.decisions())[victim]
        sched.update_from_output(plan, {r.request_id: [7] for r in plan.sampling_requests})
        step += 1
    return (
        "**The newest running request** gives its blocks back: it has done the least work, so "
        "recomputing it wastes the least. **If that is the request asking**, it preempts itself "
        "and computes nothing in this step; the older requests go on. **Its tokens are kept**: "
        "only their K/V is thrown away. When it is admitted again, its prompt *and* the tokens it "
        "had generated are recomputed, as one prompt, and it continues from there.\n\n"
        f"In the notebook's pool of {blocks} blocks of {block_size}: at step {preempted_at}, "
        f"`{victim}` is preempted while {', '.join(f'`{rid}`' for rid in asking)} runs; it is readmitted at step {back_at}, "
        f"recomputing {recomputed} tokens ({prompt_len} of prompt, {recomputed - prompt_len} it had "
        "generated) in one step. A step that preempted admits nobody: memory is tight."
    )
