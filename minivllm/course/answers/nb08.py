"""Notebook 08's answers: the serving loop."""

from __future__ import annotations

import logging
from contextlib import contextmanager

from minivllm.course.answers import question


@contextmanager
def _quiet_engine():
    """The engine logs a failed step as an error, with its traceback; here the failure is the
    point of the demonstration, so keep the log out of the answer."""
    log = logging.getLogger("minivllm")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


class _FirstStepFails:
    """An executor around the model runner whose first step raises (when ``fail``)."""

    def __init__(self, runner, fail: bool):
        self.runner, self.fail, self.calls = runner, fail, 0

    def execute(self, plan):
        self.calls += 1
        if self.fail and self.calls == 1:
            raise RuntimeError("the forward pass failed")
        return self.runner.execute(plan)


def _serve_after_a_failure(fail: bool) -> dict:
    """minivllm's engine, one seat: ``A`` (a prompt filling one block) is in the first step,
    which raises when ``fail``; ``C`` waits behind it; ``B`` has ``A``'s block-long prefix and
    arrives after that step. Returns ``{request: (finish reason, prompt tokens from the cache)}``."""
    from minivllm import LLM, SamplingParams
    from minivllm.core.engine_core import EngineCore
    from minivllm.course.runtime import engine_dtype

    def core(scheduler, runner, **kwargs):  # minivllm's step loop over the failing executor
        return EngineCore(scheduler, _FirstStepFails(runner, fail), **kwargs)

    engine = LLM(max_model_len=64, num_kv_blocks=8, max_num_seqs=1, dtype=engine_dtype(), engine_core=core).engine
    prefix = list(range(10, 26))  # 16 tokens: one full block
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request("A", prefix + [3], params)
    engine.add_request("C", [5, 6, 7], params)
    done = {}
    with _quiet_engine():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
        engine.add_request("B", prefix + [4], params)
        while engine.has_unfinished_requests():
            done.update((o.request_id, o) for o in engine.step() if o.finished)
    return {rid: (o.outputs[0].finish_reason, o.num_cached_tokens) for rid, o in sorted(done.items())}


@question("nb08.failure", "a failed step filled a block of A's prompt: may B, with the same prompt, find it "
          "cached? What becomes of A and of the others? And the first-token time of a request with "
          "max_tokens=1?")
def failure() -> str:
    from minivllm import LLM, SamplingParams
    from minivllm.course.runtime import engine_dtype

    failed, fine = _serve_after_a_failure(True), _serve_after_a_failure(False)
    one = LLM(max_model_len=64, num_kv_blocks=8, dtype=engine_dtype()).generate(
        ["Once upon a time"], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0].metrics
    return (
        "**(1) No.** The block was allocated and the forward pass was to write it, but the step raised: "
        "nothing says its K/V was written, so it must not join the prefix cache (a step's blocks are "
        "committed only after the executor returned; a failed step discards them). `A` ends, with "
        "`finish_reason=\"error\"`, and its blocks are freed; requests that were not in the step go "
        "on. On minivllm's engine, one seat, `A` in a step that raises, `C` waiting, `B` arriving "
        f"next with `A`'s first block: {_rows(failed)}. The same run without the failure: "
        f"{_rows(fine)} -- there `B` finds the block `A` wrote.\n\n"
        "**(2)** Its first-token time is the end of step 7, the moment the token exists: the same "
        f"instant as its finish (minivllm's engine: first token at {one.first_token_time:.6f} s, "
        f"finished at {one.finished_time:.6f} s: equal, {one.first_token_time == one.finished_time}). "
        "By then `update_from_output` has already retired it and returned only its delta (its id, its "
        "token, `finish_reason=\"length\"`), so the scheduler no longer knows it: the step finds the "
        "request in its own plan (`plan.requests`), or keeps it from before the update. And its "
        "first-token time must be on it before `record_finish`: the statistics keep the times a "
        "request holds when it is recorded."
    )


def _rows(served: dict) -> str:
    return "; ".join(f"`{rid}` ends `{reason}` with {cached} prompt tokens from the cache"
                     for rid, (reason, cached) in served.items())
