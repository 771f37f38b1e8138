"""An engine core with faults on cue, for the tests, wherever the core runs.

``LLM(engine_core=FaultyCore)`` / ``AsyncLLM.from_engine_args(engine_core=FaultyCore, ...)``:
the class is pickled by name, so a core in its own process (``engine_core_process=True``)
imports it from here (the core process gets the test's ``sys.path``). It is minivllm's
``EngineCore`` until a request carries one of the marker prompts below:

* ``POISON``: the model's logits for that request's rows are NaN -- its row cannot be sampled,
  so the engine must fail that request alone;
* ``BOOM``: ``step()`` itself raises while that request is running -- nobody can tell which
  requests the failure belongs to, so every request in flight fails and the engine goes on;
* ``GATED + [k]``: once that request has ``GATE_AFTER`` tokens the core waits (at most
  ``GATE_TIMEOUT_S``) until the file :func:`gate_path` ``(k)`` exists -- so that a test can see
  what reached a client while the request could not have finished, whatever the machine's speed.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from minivllm.core.engine_core import EngineCore

POISON = [1, 523, 523, 523, 523]  # token ids no sensible test prompt starts with
BOOM = [1, 611, 611, 611, 611]
GATED = [1, 733, 733, 733]  # + [k]: the gate's number
GATE_AFTER = 3
GATE_TIMEOUT_S = 60.0


def gate_path(k: int) -> Path:
    return Path(tempfile.gettempdir()) / f"minivllm-test-gate-{k}"


class _PoisonRows:
    """A sampler that first sets the logits of ``POISON``'s rows to NaN."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, logits, requests):
        for i, r in enumerate(requests):
            if list(r.prompt_token_ids) == POISON:
                logits[i, 0] = float("nan")
        return self.inner(logits, requests)


class FaultyCore(EngineCore):
    def __init__(self, scheduler, executor, **kwargs):
        super().__init__(scheduler, executor, **kwargs)
        executor.sampler = _PoisonRows(executor.sampler)

    def run_step(self, choose_tokens=None):
        if any(list(r.prompt_token_ids) == BOOM for r in self.scheduler.running):
            raise RuntimeError("boom in the model")
        for r in self.scheduler.running:
            if list(r.prompt_token_ids[:-1]) == GATED and r.num_output_tokens >= GATE_AFTER:
                _wait_for(gate_path(r.prompt_token_ids[-1]))
        return super().run_step(choose_tokens)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
