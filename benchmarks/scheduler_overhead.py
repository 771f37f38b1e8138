"""CPU cost of scheduling + KV-cache bookkeeping per decode token, with a fake model runner.

256 requests, prompt and output lengths uniform in 100..1024, ``ignore_eos``, all arriving at
once; the fake "model" returns token 7 for every row that samples. Timed: ``schedule()`` and the
plan's token counts (which the statistics read every step), committing the step's filled blocks,
and ``update_from_output()``: the scheduler, the block pool and the request bookkeeping. This is
the work a serving engine must keep far below a GPU step (a few ms). Reported: CPU microseconds
(this thread's CPU time, so other load on the machine does not inflate it) per generated token.

    python benchmarks/scheduler_overhead.py [--requests 256] [--block-sizes 16 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time

from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.math_utils import cdiv
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


def make_requests(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    params = {}
    reqs = []
    for i in range(n):
        p, o = rng.randint(100, 1024), rng.randint(100, 1024)
        sp = params.setdefault(o, SamplingParams(max_tokens=o, ignore_eos=True))
        reqs.append(Request(str(i), [rng.randrange(32000) for _ in range(p)], sp))
    return reqs


def run_once(n: int, block_size: int, seed: int, prefix_caching: bool) -> tuple[float, int, int]:
    reqs = make_requests(n, seed)
    max_len = 2048
    kv = KVCacheManager(cdiv(max_len, block_size) * n, block_size, enable_caching=prefix_caching)
    cfg = SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=8192, max_model_len=max_len)
    sched = Scheduler(cfg, kv)
    for r in reqs:
        sched.add_request(r)
    decode_tokens = prefill_tokens = steps = 0
    elapsed = 0.0
    clock = time.thread_time  # CPU time of this thread: robust to other load on the machine
    gc.collect()
    gc.disable()
    while sched.has_unfinished_requests():
        t0 = clock()
        out = sched.schedule()
        prefill_tokens += out.num_prefill_tokens  # what EngineStats.record_step reads
        t1 = clock()
        # the fake model runner (not timed): token 7 for every request that samples
        sampled = {r.request_id: [7] for r, s in zip(out.requests, out.sample) if s}
        t2 = clock()
        kv.commit_written_blocks()
        sched.update_from_output(out, sampled)
        elapsed += (t1 - t0) + (clock() - t2)
        decode_tokens += len(sampled)
        steps += 1
    gc.enable()
    assert kv.num_free_blocks == kv.num_blocks, "blocks leaked"
    assert prefill_tokens == sum(r.num_prompt_tokens for r in reqs), "every prompt token computed once"
    return elapsed, decode_tokens, steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"$ python benchmarks/scheduler_overhead.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"{args.requests} requests, prompt/output uniform in 100..1024, best of {args.repeats} runs\n")
    print("| block size | prefix caching | steps | generated tokens | us / generated token |")
    print("|---:|:---:|---:|---:|---:|")
    results = {}
    for bs in args.block_sizes:
        for caching in (False, True):
            best = min(
                (run_once(args.requests, bs, args.seed, caching) for _ in range(args.repeats)),
                key=lambda r: r[0],
            )
            us = best[0] / best[1] * 1e6
            results[(bs, caching)] = us
            print(f"| {bs} | {'on' if caching else 'off'} | {best[2]} | {best[1]} | {us:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
