"""Where each notebook's ideas live in vLLM: one table per notebook, with names that can be checked.

A notebook's "Where this lives in vLLM" section shows ``show("nbNN")``; ``tests/course/test_vllm_map.py``
reads the same rows and checks, against an installed vLLM, that every file a row names exists
and that every name it cites is defined there (or, for a flag or a default, that its text is
there). When vLLM renames a file or moves a function, that test says which row went stale.

``VLLM_VERSION`` is the release the rows were written against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.course.display import markdown

VLLM_VERSION = "0.32.0"


@dataclass(frozen=True)
class Ref:
    """A file of the vLLM source tree (``path``, from the repository root, e.g.
    ``vllm/v1/core/sched/scheduler.py``), the names it must define (``defines``: a class, a
    function, or ``Class.method``) and literal text it must contain (``contains``: a flag, a
    default value)."""

    path: str
    defines: tuple[str, ...] = ()
    contains: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    here: str  # Markdown: the minivllm side
    vllm: str  # Markdown: the vLLM side
    refs: tuple[Ref, ...] = field(default=())


TABLES: dict[str, tuple[Row, ...]] = {
    "nb00": (
        Row("`minivllm.LLM` (`minivllm/engine/llm.py`)", "`vllm/entrypoints/llm.py` — `LLM.generate`",
            (Ref("vllm/entrypoints/llm.py", ("LLM.generate",)),)),
        Row("`EngineCore.step` (`minivllm/core/engine_core.py`)",
            "`vllm/v1/engine/core.py` — `EngineCore.step` (schedule → execute → update)",
            (Ref("vllm/v1/engine/core.py", ("EngineCore.step",)),)),
        Row("`ModelRunner` (`minivllm/engine/model_runner.py`)",
            "`vllm/v1/worker/gpu_model_runner.py` — `GPUModelRunner`",
            (Ref("vllm/v1/worker/gpu_model_runner.py", ("GPUModelRunner",)),)),
        Row("`LlamaFamilyModel.allocate_kv_cache`",
            "`GPUModelRunner.initialize_kv_cache`; sizes from `vllm/v1/kv_cache_interface.py` "
            "(`FullAttentionSpec.page_size_bytes`) and `get_kv_cache_configs()` in "
            "`vllm/v1/core/kv_cache_utils.py`",
            (Ref("vllm/v1/worker/gpu_model_runner.py", ("GPUModelRunner.initialize_kv_cache",)),
             Ref("vllm/v1/kv_cache_interface.py", ("FullAttentionSpec", "page_size_bytes")),
             Ref("vllm/v1/core/kv_cache_utils.py", ("get_kv_cache_configs",)))),
        Row("KV memory budget (`kv_cache_memory`)",
            "`gpu_memory_utilization` in `vllm/config/cache.py` (`CacheConfig`)",
            (Ref("vllm/config/cache.py", ("CacheConfig",), ("gpu_memory_utilization",)),)),
        Row("an H100's memory, `HARDWARE[\"H100-SXM\"].memory_bytes` (the datasheet's 80 GB = 80e9 bytes)",
            "vLLM asks the driver: `MemorySnapshot` in `vllm/utils/mem_utils.py` reads "
            "`torch.accelerator.get_memory_info`, which on an H100 reports ~81,559 MiB = 85.5e9 "
            "bytes (79.6 GiB); `gpu_memory_utilization` is a share of that figure",
            (Ref("vllm/utils/mem_utils.py", ("MemorySnapshot", "MemorySnapshot.total_memory"),
                 ("get_memory_info",)),)),
    ),
    "nb09": (
        Row("`SchedulingPolicy` objects: `FCFSPolicy`, `PriorityPolicy` (`minivllm/core/policies.py`)",
            "`SchedulingPolicy` enum (`FCFS`, `PRIORITY`) and the waiting queues `FCFSRequestQueue`, "
            "`PriorityRequestQueue` in `vllm/v1/core/sched/request_queue.py`; the policy is "
            "`SchedulerConfig.policy` in `vllm/config/scheduler.py`, `--scheduling-policy` on the "
            "command line",
            (Ref("vllm/v1/core/sched/request_queue.py",
                 ("SchedulingPolicy", "FCFSRequestQueue", "PriorityRequestQueue")),
             Ref("vllm/config/scheduler.py", ("SchedulerConfig",), ("policy: SchedulerPolicy",)),
             Ref("vllm/engine/arg_utils.py", (), ("--scheduling-policy",)))),
        Row("the victim when a running request cannot grow",
            "`Scheduler.schedule()` in `vllm/v1/core/sched/scheduler.py`: `self.running.pop()` under "
            "FCFS, the largest `(priority, arrival_time)` under priority; `Scheduler._preempt_request()` "
            "frees the blocks and puts the request back at the front of the waiting queue",
            (Ref("vllm/v1/core/sched/scheduler.py", ("Scheduler.schedule", "Scheduler._preempt_request"),
                 ("self.running.pop()",)),)),
        Row("`LLM.generate(..., priority=[...])`",
            "`LLM.generate(..., priority=...)` in `vllm/entrypoints/llm.py` (lower is more important)",
            (Ref("vllm/entrypoints/llm.py", ("LLM.generate",), ("priority",)),)),
        Row("`max_num_seqs` (256 in the simulated runs)",
            "`SchedulerConfig.max_num_seqs`; its default comes from `EngineArgs.get_batch_defaults()` "
            "in `vllm/engine/arg_utils.py`: 1024 on a GPU of 70 GiB or more (an H100) that is not an "
            "A100, 256 on smaller ones",
            (Ref("vllm/config/scheduler.py", (), ("max_num_seqs",)),
             Ref("vllm/engine/arg_utils.py", ("EngineArgs.get_batch_defaults",),
                 ("UsageContext.LLM_CLASS: 1024", "UsageContext.LLM_CLASS: 256")))),
        Row("`kv_dtype=\"int8\"` / `\"int4\"` in the simulator",
            "`CacheConfig.cache_dtype` in `vllm/config/cache.py` (`--kv-cache-dtype`, e.g. `fp8`)",
            (Ref("vllm/config/cache.py", ("CacheConfig",), ("cache_dtype",)),
             Ref("vllm/engine/arg_utils.py", (), ("--kv-cache-dtype",)))),
        Row("`Request.num_preemptions`, `EngineStats` preemptions",
            "`Request.num_preemptions` in `vllm/v1/request.py`; the `vllm:num_preemptions` counter "
            "of the Prometheus metrics (`vllm/v1/metrics/loggers.py`)",
            (Ref("vllm/v1/request.py", ("Request",), ("num_preemptions",)),
             Ref("vllm/v1/metrics/loggers.py", (), ("vllm:num_preemptions",)))),
        Row("prefix caching (`enable_prefix_caching`)",
            "`--enable-prefix-caching`; the hash chain and lookup in `vllm/v1/core/kv_cache_utils.py` "
            "(`hash_block_tokens`) and `KVCacheManager.get_computed_blocks()` in "
            "`vllm/v1/core/kv_cache_manager.py`",
            (Ref("vllm/v1/core/kv_cache_utils.py", ("hash_block_tokens",)),
             Ref("vllm/v1/core/kv_cache_manager.py", ("KVCacheManager.get_computed_blocks",)),
             Ref("vllm/engine/arg_utils.py", (), ("--enable-prefix-caching",)))),
    ),
    "nb10": (
        Row("a simulated chat run and `saturated_throughput`",
            "`vllm bench throughput` (`vllm/benchmarks/throughput.py`): offline tokens/s of a "
            "dataset. `vllm bench serve` (`vllm/benchmarks/serve.py`) measures throughput and time "
            "per output token under a request rate: both axes of the frontier",
            (Ref("vllm/benchmarks/throughput.py"), Ref("vllm/benchmarks/serve.py"))),
        Row("KV pool = memory × `gpu_memory_utilization` − weights − activations",
            "`Worker.determine_available_memory()` in `vllm/v1/worker/gpu_worker.py` runs "
            "`GPUModelRunner.profile_run()` and returns the budget minus the profiled peak; "
            "`get_kv_cache_configs()` and `get_kv_cache_config_from_groups()` in "
            "`vllm/v1/core/kv_cache_utils.py` turn the bytes into blocks",
            (Ref("vllm/v1/worker/gpu_worker.py", ("Worker.determine_available_memory",)),
             Ref("vllm/v1/worker/gpu_model_runner.py", ("GPUModelRunner.profile_run",)),
             Ref("vllm/v1/core/kv_cache_utils.py",
                 ("get_kv_cache_configs", "get_kv_cache_config_from_groups")))),
        Row("`gpu_memory_utilization`, `kv_dtype=\"int8\"`",
            "`CacheConfig.gpu_memory_utilization` and `CacheConfig.cache_dtype` (`--kv-cache-dtype`, "
            "e.g. `fp8`) in `vllm/config/cache.py`",
            (Ref("vllm/config/cache.py", ("CacheConfig",), ("gpu_memory_utilization", "cache_dtype")),)),
        Row("`max_num_seqs=64` / `256` in section 3",
            "`--max-num-seqs`; left unset, `EngineArgs.get_batch_defaults()` in "
            "`vllm/engine/arg_utils.py` picks 1024 on an H100 (256 on GPUs under 70 GiB and on A100s)",
            (Ref("vllm/engine/arg_utils.py", ("EngineArgs.get_batch_defaults",),
                 ("--max-num-seqs", "UsageContext.LLM_CLASS: 1024")),)),
        Row("`weight_dtype=\"int4\"`, group 128, 4-bit zero points",
            "`--quantization awq` (or `awq_marlin`): both map to `AutoAWQConfig` in "
            "`vllm/model_executor/layers/quantization/auto_awq.py`, whose checkpoints hold `qweight`, "
            "`qzeros` (4-bit, packed like the weights) and fp16 `scales` per group",
            (Ref("vllm/model_executor/layers/quantization/auto_awq.py", ("AutoAWQConfig",),
                 ("qzeros", "scales")),
             Ref("vllm/model_executor/layers/quantization/__init__.py", (),
                 ('"awq": AutoAWQConfig', '"awq_marlin": AutoAWQConfig')))),
        Row("speculative decoding (estimated, not simulated)",
            "`SpeculativeConfig` in `vllm/config/speculative.py`; proposers in `vllm/v1/spec_decode/` "
            "(`draft_model.py`, `eagle.py`, `ngram_proposer.py`); verification in "
            "`vllm/v1/sample/rejection_sampler.py`",
            (Ref("vllm/config/speculative.py", ("SpeculativeConfig",)),
             Ref("vllm/v1/spec_decode/draft_model.py"), Ref("vllm/v1/spec_decode/eagle.py"),
             Ref("vllm/v1/spec_decode/ngram_proposer.py"), Ref("vllm/v1/sample/rejection_sampler.py"))),
    ),
    "nb11": (
        Row("`LLM(speculative_config={\"method\": \"ngram\", \"num_speculative_tokens\": k})` or "
            "`\"draft_model\"` with its `\"model\"` (`minivllm/spec_decode/config.py`)",
            "`SpeculativeConfig` in `vllm/config/speculative.py` (`method`, `num_speculative_tokens`, "
            "`prompt_lookup_max` / `prompt_lookup_min`, `model`); `--speculative-config` takes the same JSON",
            (Ref("vllm/config/speculative.py", ("SpeculativeConfig",),
                 ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")),
             Ref("vllm/engine/arg_utils.py", (), ("--speculative-config",)))),
        Row("n-gram lookup (`minivllm/spec_decode/ngram.py`): n-grams of `prompt_lookup_max = 4` down "
            "to `prompt_lookup_min = 1` tokens, the longest that recurs, copied after its most recent "
            "occurrence",
            "`NgramProposer` in `vllm/v1/spec_decode/ngram_proposer.py` (prompt lookup over the request's "
            "own tokens, on the CPU): the longest n-gram that recurs, copied after its earliest "
            "occurrence (`_find_longest_matched_ngram_and_propose_tokens`); with neither bound given, "
            "`SpeculativeConfig` in `vllm/config/speculative.py` sets `prompt_lookup_min = "
            "prompt_lookup_max = 5`",
            (Ref("vllm/v1/spec_decode/ngram_proposer.py", ("NgramProposer",),
                 ("_find_longest_matched_ngram_and_propose_tokens",)),
             Ref("vllm/config/speculative.py", ("SpeculativeConfig",),
                 ("self.prompt_lookup_min = 5", "self.prompt_lookup_max = 5")))),
        Row("a draft model (`minivllm/spec_decode/draft_model.py`)",
            "`DraftModelProposer` in `vllm/v1/spec_decode/draft_model.py`, built on `EagleProposer` "
            "(`vllm/v1/spec_decode/eagle.py`): EAGLE's drafting head reads the target's hidden states "
            "instead of running a second model",
            (Ref("vllm/v1/spec_decode/draft_model.py", ("DraftModelProposer",)),
             Ref("vllm/v1/spec_decode/eagle.py", ("EagleProposer",)))),
        Row("`rejection.verify` and your `verify_step`",
            "`RejectionSampler` in `vllm/v1/sample/rejection_sampler.py`: the same rule over the whole "
            "batch, in Triton kernels; the token after a rejection is its \"recovered\" token",
            (Ref("vllm/v1/sample/rejection_sampler.py", ("RejectionSampler",), ("recovered",)),)),
        Row("`spec_draft_tokens`, `spec_accepted_tokens`, `spec_acceptance_rate`, `spec_mean_accepted_length`",
            "`SpecDecodingStats` in `vllm/v1/spec_decode/metrics.py` (`num_draft_tokens`, "
            "`num_accepted_tokens`, per position), logged as the acceptance rate and mean acceptance length",
            (Ref("vllm/v1/spec_decode/metrics.py", ("SpecDecodingStats",),
                 ("num_draft_tokens", "num_accepted_tokens")),)),
        Row("rolling back rejected drafts (`KVCacheManager.trim`)",
            "vLLM's scheduler counts only the accepted tokens as computed "
            "(`Scheduler.update_from_output()` in `vllm/v1/core/sched/scheduler.py` subtracts "
            "`num_rejected` from `num_computed_tokens`); the rejected drafts' K/V slots are written over "
            "by the next step",
            (Ref("vllm/v1/core/sched/scheduler.py", ("Scheduler.update_from_output",),
                 ("num_computed_tokens -= num_rejected",)),)),
        Row("`kv_cache_dtype=\"int8\"`: int8 codes and a float32 scale per token and KV head",
            "`CacheConfig.cache_dtype` in `vllm/config/cache.py` (`--kv-cache-dtype`): 8-bit KV as "
            "`fp8` (`fp8_e4m3`, `fp8_e5m2`) with one scale per tensor for K and one for V, or with a "
            "scale per token and KV head like minivllm's, `int8_per_token_head` and "
            "`fp8_per_token_head`",
            (Ref("vllm/config/cache.py", ("CacheConfig",),
                 ("cache_dtype", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head")),
             Ref("vllm/engine/arg_utils.py", (), ("--kv-cache-dtype",)))),
    ),
}


def table(notebook: str) -> str:
    """The Markdown table of ``notebook`` (a key of ``TABLES``, e.g. ``"nb09"``)."""
    if notebook not in TABLES:
        raise KeyError(f"no vLLM table for {notebook!r}; tables: {', '.join(TABLES)}")
    lines = ["| here | vLLM |", "|---|---|"]
    lines += [f"| {row.here} | {row.vllm} |" for row in TABLES[notebook]]
    return "\n".join(lines) + f"\n\nNames as of vLLM {VLLM_VERSION}."


def show(notebook: str) -> None:
    """Display ``notebook``'s table (rendered in Jupyter, printed in a terminal)."""
    markdown(table(notebook))
