"""The engine loop with the model replaced by a clock: GPU-scale serving on a laptop.

:class:`Simulator` builds *the same* scheduler and KV-cache manager objects that
:class:`minivllm.engine.LLMEngine` builds from the same engine arguments, feeds them a trace,
and at every step asks a :class:`~minivllm.sim.cost_model.CostModel` how long the step's batch
would take on the chosen GPU instead of running a model. Every scheduling decision (admission,
chunking, preemption, static-batch padding) is therefore the real one; only time is modelled.

Differences from the engine, on purpose:

* sampled tokens are placeholders (``placeholder_token``); every request runs with
  ``ignore_eos=True`` and ``max_tokens`` = the trace's output length, so it ends exactly there;
* the clock is simulated: a step starts at ``clock`` and lasts the cost model's time; requests
  join the waiting queue when the clock passes their arrival time; when nothing is running the
  clock jumps to the next arrival;
* the KV pool is sized from the GPU's memory: ``memory x gpu_memory_utilization - weights -
  activation reserve`` (like vLLM's ``gpu_memory_utilization``), unless ``num_kv_blocks`` or
  ``kv_cache_memory`` is given explicitly, exactly as for the engine.

It fills the same :class:`~minivllm.metrics.EngineStats` (one ``StepStats`` per step, one
``RequestMetrics`` per request), so every table and plot works on both.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from minivllm.config import (
    EngineArgs,
    build_engine_core,
    build_scheduler,
    resolve_max_model_len,
    resolve_num_kv_blocks,
)
from minivllm.core.engine_core import EngineStalledError
from minivllm.core.messages import EngineCoreOutputs
from minivllm.engine.input_processor import InputProcessor
from minivllm.metrics import EngineStats
from minivllm.model.config import INT8_SCALE_BYTES
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams
from minivllm.sim.cost_model import CostModel, StepCost
from minivllm.sim.executor import ModelFreeExecutor
from minivllm.sim.hardware import Hardware, get_hardware
from minivllm.sim.model_spec import ModelSpec, preset
from minivllm.sim.speculation import SimulatedDrafts


class Simulator:
    """``Simulator(model, hardware, **engine_args).run(trace) -> EngineStats``.

    ``model``: a :class:`ModelSpec` or a preset name; ``hardware``: a :class:`Hardware` or a
    name from :data:`minivllm.sim.hardware.HARDWARE`. ``engine_args`` are the keywords of
    :class:`minivllm.config.EngineArgs` (``block_size``, ``num_kv_blocks``, ``max_num_seqs``,
    ``scheduler``, ``kv_cache``, ... including plug-in instances); arguments about the model
    runner (``dtype``, ``device``, ``attention_backend``) are accepted and ignored. The KV
    dtype is the ``ModelSpec``'s ``kv_dtype``; ``kv_cache_dtype="int8"`` makes it the engine's 8-bit layout (``"int8"`` plus a
    float32 scale per token and KV head).

    Speculative decoding: ``speculative_config`` as for the engine, whose draft ``model`` is a
    :class:`ModelSpec` or a preset name, plus ``acceptance_rate``, the chance that each draft
    is accepted (``minivllm/sim/speculation.py``). The draft model's weights and K/V come out
    of the KV pool's memory, and its passes are added to each step's time.
    """

    def __init__(
        self,
        model: ModelSpec | str,
        hardware: Hardware | str,
        *,
        cost_model: CostModel | None = None,
        gpu_memory_utilization: float = 0.9,
        activation_reserve_bytes: float | None = None,
        record_decisions: bool = False,
        placeholder_token: int = 0,
        acceptance_rate: float | None = None,
        **engine_args,
    ):
        self.model = preset(model) if isinstance(model, str) else model
        if engine_args.get("kv_cache_dtype") == "int8":
            # the engine argument, honoured the simulator's way: the spec's KV format (which
            # sizes the pool and the KV traffic of every step) is the engine's 8-bit layout,
            # its float32 scale per token and KV head included
            self.model = dataclasses.replace(self.model, kv_dtype="int8", kv_scale_bytes=INT8_SCALE_BYTES)
        self.hardware = get_hardware(hardware)
        self.cost_model = cost_model or CostModel(self.model, self.hardware)
        if self.cost_model.model != self.model or self.cost_model.hardware != self.hardware:
            raise ValueError("cost_model was built for another model or hardware")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        self.gpu_memory_utilization = gpu_memory_utilization
        given_draft = self._draft_spec_given(engine_args)
        self.args = args = EngineArgs.from_kwargs(**engine_args)
        spec = args.speculative_config
        self.draft_model = self._draft_model(spec, given_draft)
        if (spec is None) != (acceptance_rate is None):
            raise ValueError(
                "speculative_config and acceptance_rate go together: the simulator cannot tell which "
                "drafts a model would accept, so it accepts each with probability acceptance_rate "
                f"(got speculative_config={engine_args.get('speculative_config')!r}, "
                f"acceptance_rate={acceptance_rate!r})"
            )
        self.max_model_len = resolve_max_model_len(args, self.model.max_position_embeddings)
        self.input_processor = InputProcessor(self.max_model_len, self.model.vocab_size)
        self._activation_reserve = (
            activation_reserve_bytes
            if activation_reserve_bytes is not None
            else self.estimate_activation_bytes(args.token_budget(self.max_model_len), args.max_num_seqs)
        )
        self.scheduler = build_scheduler(args, self.max_model_len, self._num_kv_blocks)
        self.kv = self.scheduler.kv
        drafts = None
        if spec is not None:
            draft_cost = (None if self.draft_model is None
                          else dataclasses.replace(self.cost_model, model=self.draft_model))
            drafts = SimulatedDrafts(spec, acceptance_rate, draft_cost, self.max_model_len, args.seed,
                                     placeholder_token)
        self.executor = ModelFreeExecutor(self.cost_model, placeholder_token=placeholder_token, drafts=drafts)
        self.core = build_engine_core(args, self.scheduler, self.executor, self.executor.clock)
        self.record_decisions = record_decisions
        self.decisions: list[list[tuple[str, int]]] = []  # one entry per step, if recorded

    @property
    def stats(self) -> EngineStats:
        return self.core.stats

    @property
    def clock(self) -> float:
        """The simulated time (seconds)."""
        return self.executor.now

    @clock.setter
    def clock(self, value: float) -> None:
        self.executor.now = value

    @property
    def step_costs(self) -> list[StepCost]:
        return self.executor.step_costs

    # --- memory --------------------------------------------------------------------------
    def estimate_activation_bytes(self, max_batched_tokens: int, max_num_seqs: int) -> float:
        """Peak transient memory of one forward pass (a rough stand-in for vLLM's profiling run):
        the widest per-token intermediate (hidden + 2 x MLP width, 16-bit) for every batched
        token, plus fp32 logits for every sampled row."""
        m = self.model
        per_token = (m.hidden_size + 2 * m.intermediate_size) * 2
        return max_batched_tokens * per_token + max_num_seqs * m.vocab_size * 4

    @property
    def kv_block_bytes(self) -> float:
        """A block's K/V bytes, the draft model's own K/V in the same block included."""
        per_token = self.model.kv_bytes_per_token()
        if self.draft_model is not None:
            per_token += self.draft_model.kv_bytes_per_token()
        return per_token * self.args.block_size

    def kv_memory_from_hardware(self) -> float:
        """Bytes left for the KV cache: usable memory minus weights (a draft model's too) minus
        activations."""
        usable = self.hardware.memory_bytes * self.gpu_memory_utilization
        weights = self.model.weight_bytes + (self.draft_model.weight_bytes if self.draft_model else 0.0)
        return usable - weights - self._activation_reserve

    @staticmethod
    def _draft_spec_given(engine_args: dict) -> ModelSpec | None:
        """A ``speculative_config`` dict whose draft ``model`` is a :class:`ModelSpec`: the spec,
        with the config given its name instead (the engine's config holds a string)."""
        spec = engine_args.get("speculative_config")
        if isinstance(spec, dict) and isinstance(spec.get("model"), ModelSpec):
            engine_args["speculative_config"] = {**spec, "model": spec["model"].name}
            return spec["model"]
        return None

    def _draft_model(self, spec, given: ModelSpec | None) -> ModelSpec | None:
        """The draft model of a parsed ``speculative_config``: the spec given, else the preset its
        ``model`` names; 8-bit K/V when the target's is (one cache format for both)."""
        if spec is None or spec.method != "draft_model":
            return None
        draft = given
        if draft is None:
            try:
                draft = preset(spec.model)
            except KeyError as err:
                raise ValueError(f"speculative_config['model'] for the simulator is a ModelSpec or a preset "
                                 f"name: {err.args[0]}") from None
        if self.model.kv_dtype == "int8":
            draft = dataclasses.replace(draft, kv_dtype="int8", kv_scale_bytes=self.model.kv_scale_bytes)
        return draft

    def _num_kv_blocks(self) -> int:
        return resolve_num_kv_blocks(self.args, self.max_model_len, self.kv_block_bytes, self._hardware_kv_memory)

    def _hardware_kv_memory(self) -> float:
        memory = self.kv_memory_from_hardware()
        if memory <= 0:
            raise ValueError(
                f"{self.model.name} weights ({self.model.weight_bytes / 1e9:.1f} GB) leave no room "
                f"for a KV cache on {self.hardware.name} ({self.hardware.memory_bytes / 1e9:.0f} GB x "
                f"{self.gpu_memory_utilization})"
            )
        return memory

    @property
    def num_kv_blocks(self) -> int:
        return self.kv.num_blocks

    # --- requests ------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        output_len: int,
        arrival_time: float = 0.0,
        priority: int = 0,
    ) -> Request:
        try:
            self.input_processor.check_prompt(prompt_token_ids)
        except ValueError as err:
            raise ValueError(f"request {request_id}: {err}") from None
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_len)
        req = Request(request_id, list(prompt_token_ids), params, arrival_time=arrival_time, priority=priority)
        self.core.add_request(req)
        return req

    # --- the loop ------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        """One engine step at the current clock; returns what it did."""
        outputs = self.core.step()
        if self.record_decisions:
            self.decisions.append(outputs.plan.decisions())
        return outputs

    def run(self, trace: Iterable, max_steps: int | None = None, check_invariants: bool = False) -> EngineStats:
        """Serve every item of ``trace`` (objects with ``request_id``, ``arrival_time``,
        ``output_len``, ``priority`` and ``prompt_token_ids(vocab_size)``, e.g.
        :class:`minivllm.workloads.TraceItem`) to completion; return the statistics.
        Raises :class:`~minivllm.core.engine_core.EngineStalledError` if requests wait that can
        never be scheduled."""
        items = sorted(trace, key=lambda it: it.arrival_time)  # stable: ties keep trace order
        i = 0
        steps_left = math.inf if max_steps is None else max_steps
        sched = self.scheduler
        while i < len(items) or sched.has_unfinished_requests():
            if not sched.has_unfinished_requests() and items[i].arrival_time > self.clock:
                self.clock = items[i].arrival_time  # idle GPU: jump to the next arrival
            while i < len(items) and items[i].arrival_time <= self.clock:
                it = items[i]
                self.add_request(
                    it.request_id, it.prompt_token_ids(self.model.vocab_size), it.output_len,
                    arrival_time=it.arrival_time, priority=it.priority,
                )
                i += 1
            if steps_left <= 0:
                break
            self.step()
            steps_left -= 1
            if check_invariants:
                self.core.check_invariants()
        return self.stats

    # --- summaries -----------------------------------------------------------------------
    def summary(self) -> dict[str, float]:
        """``EngineStats.summary()`` plus simulator-only figures (simulated span, cost)."""
        s = self.stats.summary()
        steps = self.stats.steps
        span = (steps[-1].start_time + steps[-1].duration - steps[0].start_time) if steps else 0.0
        s["span_s"] = span
        s["kv_blocks_total"] = self.kv.num_blocks
        s["kv_capacity_tokens"] = self.kv.num_blocks * self.args.block_size
        busy = s["total_time_s"]
        s["usd"] = busy / 3600 * self.hardware.usd_per_hour
        s["output_tokens_per_usd"] = s["output_tokens"] / s["usd"] if s["usd"] else float("nan")
        return s


__all__ = ["Simulator", "ModelFreeExecutor", "EngineStalledError"]
