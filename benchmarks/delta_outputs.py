"""What one output token costs around the model, early in an answer and 10,000 tokens in.

A batch of requests generates long answers through minivllm's real ``EngineCore`` (scheduler,
KV cache manager, prefix-cache hashing), with the model replaced by an executor that "samples"
the tokens of a real story in a loop -- so the detokenizer decodes real text -- and the front
end's real work after every step: the step's deltas (``EngineCoreOutputs.deltas``) and the
``OutputProcessor`` (detokenizing, stop strings, building outputs). Per output token it times

* the core's bookkeeping (a step minus the executor),
* the front end, for outputs of kind ``DELTA`` (what streams get) and ``CUMULATIVE`` (the whole
  text so far on every step, what every output was before deltas),

over the first tokens of the answers and over tokens around position ``--length`` (the median
step of each window of 100, per token). With deltas the two must be the same; cumulative outputs
grow with the answer.

    python benchmarks/delta_outputs.py [--length 10000] [--early 100] [--batch 16] [--stop]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

from minivllm import TINY_MODEL_DIR, SamplingParams
from minivllm.core.engine_core import EngineCore
from minivllm.core.interfaces import ModelRunnerOutput
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.messages import EngineCoreRequest
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.engine.output_processor import OutputProcessor
from minivllm.model.loader import load_tokenizer
from minivllm.outputs import RequestOutputKind

STORY = ("Once upon a time there was a little fox who lived in a quiet forest near a river. Every "
         "morning she walked to the water to drink, and every evening she came home to her den. ")
WINDOW = 100  # tokens per request averaged at each end


class StoryExecutor:
    """Samples, for each request, the next token of a story read in a loop (no model)."""

    def __init__(self, story: list[int]):
        self.story = story

    def execute(self, out) -> ModelRunnerOutput:
        story, n = self.story, len(self.story)
        return ModelRunnerOutput(new_token_ids={
            r.request_id: [story[r.num_output_tokens % n]] for r, s in zip(out.requests, out.sample, strict=True) if s})


@dataclass
class Costs:
    """Microseconds per output token, early in the answers and late."""

    core_early: float
    core_late: float
    front_early: float
    front_late: float


def run(kind: RequestOutputKind, length: int, early: int, batch: int, stop: bool) -> Costs:
    tok = load_tokenizer(TINY_MODEL_DIR)
    story = tok(STORY * 4, add_special_tokens=False).input_ids
    kv = KVCacheManager(num_blocks=batch * (length // 16 + 4), block_size=16, enable_caching=True)
    config = SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=4096, max_model_len=length + 64)
    executor = StoryExecutor(story)
    core = EngineCore(Scheduler(config, kv), executor)
    op = OutputProcessor(tok)
    params = SamplingParams(max_tokens=length, ignore_eos=True, stop=["\x00 never"] if stop else None)
    for i in range(batch):
        req = EngineCoreRequest(f"r{i}", [1, *story[i : i + 8]], params, time.perf_counter())
        samples = req.samples(())
        core.add_request(samples[0])
        op.add_request(req.request_id, None, req.prompt_token_ids, params, kind)
    execute = executor.execute
    executor_time = [0.0]

    def timed_execute(out):
        t = time.perf_counter()
        result = execute(out)
        executor_time[0] += time.perf_counter() - t
        return result

    executor.execute = timed_execute
    core_times, front_times = [], []  # per decode step
    while core.has_unfinished_requests():
        executor_time[0] = 0.0
        t0 = time.perf_counter()
        outputs = core.step()
        t1 = time.perf_counter()
        op.process(outputs.deltas)
        t2 = time.perf_counter()
        core_times.append(t1 - t0 - executor_time[0])
        front_times.append(t2 - t1)

    def per_token(times: list[float], first: int) -> float:
        """The median step of the window (robust to a preempted process), per output token."""
        return 1e6 * statistics.median(times[first : first + WINDOW]) / batch

    late = length - WINDOW - 1
    # the first step prefills: start the early window at the first decode step
    return Costs(per_token(core_times, early), per_token(core_times, late),
                 per_token(front_times, early), per_token(front_times, late))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=10_000, help="output tokens per request")
    ap.add_argument("--early", type=int, default=100, help="where the early window starts")
    ap.add_argument("--batch", type=int, default=16, help="requests generating together")
    ap.add_argument("--stop", action="store_true", help="give every request a stop string (never hit)")
    args = ap.parse_args(argv)
    if args.length < args.early + 2 * WINDOW:
        ap.error(f"--length must be at least --early + {2 * WINDOW}")
    print(f"$ python benchmarks/delta_outputs.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"{args.batch} requests, {args.length} output tokens each, the model replaced by a story read in a "
          f"loop; microseconds per output token, the median step of tokens {args.early}-{args.early + WINDOW} and "
          f"{args.length - WINDOW - 1}-{args.length - 1}\n")
    print("| outputs | core bookkeeping, early | late | front end, early | late | late / early (front end) |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        c = run(kind, args.length, args.early, args.batch, args.stop)
        print(f"| {kind.name} | {c.core_early:.1f} | {c.core_late:.1f} | {c.front_early:.1f} | {c.front_late:.1f} "
              f"| {c.front_late / c.front_early:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
