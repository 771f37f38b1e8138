"""Notebook 02's answers: continuous batching."""

from __future__ import annotations

from minivllm.course.answers import question


@question("nb02.head_of_line", "section 2's step with a 14-token `d`: what does the step compute, how much of "
          "the budget goes unused, and why accept that rather than let `e` in?")
def head_of_line() -> str:
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.core.scheduler import Scheduler, SchedulerConfig
    from minivllm.request import Request
    from minivllm.sampling_params import SamplingParams

    budget = 16
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=budget, max_model_len=budget,
                             enable_chunked_prefill=False)
    sched = Scheduler(config, KVCacheManager(num_blocks=32, block_size=4, enable_caching=False))

    def request(rid: str, prompt_len: int) -> Request:
        return Request(rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=8, ignore_eos=True))

    for rid, n in (("a", 5), ("b", 3), ("c", 6)):
        sched.add_request(request(rid, n))
    first = sched.schedule()
    sched.update_from_output(first, {r.request_id: [7] for r in first.sampling_requests})
    long_len, short_len = budget - 2, 2
    sched.add_request(request("d", long_len))
    sched.add_request(request("e", short_len))
    plan = sched.schedule()
    left = budget - plan.total_tokens
    return (
        f"It stops admitting. In minivllm's scheduler, with `a`, `b`, `c` decoding and `d` ({long_len} "
        f"tokens) waiting ahead of `e` ({short_len}), the plan is {plan.decisions()}: {left} budget tokens "
        f"are left, `e`'s {short_len} would fit, and still nobody is admitted "
        f"(waiting: {[r.request_id for r in sched.waiting]}).\n\n"
        "That is first come, first served. If shorter prompts could overtake, a long prompt would wait "
        "as long as short ones kept arriving: under load it might never run. Stopping at the head "
        "costs a few idle budget tokens in this step; the head gets in as soon as the decodes leave "
        "room. (With chunked prefill, notebook 03, the head simply gets what is left of the budget.)"
    )
