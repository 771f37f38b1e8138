"""Engine arguments: every keyword ``LLM(model, ...)`` accepts, checked at the door.

Pure Python (no torch): the simulator shares these arguments and the functions below that turn
them into limits (``max_model_len``, the KV pool's size), a KV cache manager and a scheduler, so
the engine and the simulator derive exactly the same limits and objects from the same arguments.

The three plug-in points take a name *or* an object that implements the protocol
(``minivllm.core.interfaces``, ``minivllm.attention``):

* ``kv_cache="paged" | "contiguous" | <KVCacheManagerInterface instance>``
* ``scheduler="continuous" | "static" | <SchedulerInterface instance> | <factory(config, kv)>``
* ``attention_backend="auto" | "cpp" | "torch" | "torch_padded" | "triton" | <backend instance>``

and the step loop itself can be replaced: ``engine_core=<EngineCore subclass or factory>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minivllm.core.interfaces import (
    KVCacheManagerInterface,
    SchedulerInterface,
    SpeculativeKVCacheManager,
    SpeculativeScheduler,
    check_implements,
)
from minivllm.core.policies import make_policy
from minivllm.core.scheduler import SchedulerConfig
from minivllm.math_utils import cdiv
from minivllm.spec_decode.config import SpeculativeConfig

SCHEDULERS = ("continuous", "static")
KV_CACHES = ("paged", "contiguous")
ATTENTION_BACKENDS = ("auto", "cpp", "torch", "torch_padded", "triton")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KV_CACHE_DTYPES = ("auto", "int8")  # "auto": the model's dtype; how the others are stored: kv_quant.CACHE_STORAGE
DEFAULT_TOKEN_BUDGET = 2048


def check_int(name: str, value: Any, minimum: int | None = None, allow_none: bool = False) -> None:
    """``TypeError``/``ValueError`` naming ``name`` unless ``value`` is an int >= ``minimum``."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {name}={value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")


def check_bool(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {name}={value!r} ({type(value).__name__})")


def _check_choice(
    name: str, value: Any, names: tuple[str, ...], protocol: type | None, factory_ok: bool = False
) -> None:
    """A name from ``names``, or an instance implementing ``protocol`` (or, with
    ``factory_ok``, a class or function that returns one)."""
    if isinstance(value, str):
        if value not in names:
            raise ValueError(f"{name}={value!r} is not one of {names}")
    elif callable(value) and (factory_ok or isinstance(value, type)):
        if not factory_ok:
            raise TypeError(f"{name} takes an instance, not the class {value.__name__}: call it first")
    elif protocol is not None:
        check_implements(value, protocol, name)


@dataclass
class EngineArgs:
    block_size: int = 16
    num_kv_blocks: int | None = None  # explicit pool size; else derived from kv_cache_memory
    kv_cache_memory: int | None = None  # bytes for K and V of all layers; default: see engine
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: 2048, at least max_model_len unchunked
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool | None = None  # default: on for the paged cache, else off
    scheduler: Any = "continuous"
    kv_cache: Any = "paged"
    attention_backend: Any = "auto"
    dtype: str = "auto"
    device: str | None = None
    seed: int | None = 0
    scheduling_policy: Any = "fcfs"  # "fcfs" | "priority" | <SchedulingPolicy instance>
    tokenizer: str | None = None  # tokenizer directory if not the model's own
    skip_tokenizer_init: bool = False  # no tokenizer: token-id prompts in, token ids out
    cpu_threads: int | None = None  # torch threads on a CPU; None: the cores free at build (engine/cpu_threads.py)
    debug_checks: bool = False  # check KV invariants and every K/V read after each step
    engine_core: Any = None  # the step loop: an EngineCore subclass or factory (default EngineCore)
    # the engine core (scheduler, KV cache, model) in a process of its own, reached through
    # messages; False: in the caller's process (notebooks, debugging, plug-ins from a notebook)
    engine_core_process: bool = False
    # speculative decoding: {"method": "ngram" | "draft_model", "num_speculative_tokens": k, ...}
    # (minivllm/spec_decode/config.py), or its JSON text; None: off
    speculative_config: Any = None
    # the KV cache's number format: "auto" (the model's dtype) or "int8" (codes + a float32
    # scale per token and KV head; about half the bytes of a 16-bit cache)
    kv_cache_dtype: str = "auto"
    # decode steps through static per-batch-bucket buffers (minivllm/engine/graph_decode.py), and
    # on a CUDA device captured as CUDA graphs and replayed. Off by default until a GPU has
    # measured it (scripts/gpu_check.sh, step "graphs"); the "triton" attention backend only.
    cuda_graphs: bool = False

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineArgs:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; valid: {sorted(known)}")
        return cls(**kwargs)

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size)
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be a power of two from 1 to 256, got {self.block_size}")
        check_int("num_kv_blocks", self.num_kv_blocks, 1, allow_none=True)
        check_int("kv_cache_memory", self.kv_cache_memory, 1, allow_none=True)
        check_int("max_num_seqs", self.max_num_seqs, 1)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1, allow_none=True)
        # a request needs one prompt token and room to generate one token
        check_int("max_model_len", self.max_model_len, 2, allow_none=True)
        check_int("seed", self.seed, 0, allow_none=True)
        check_int("cpu_threads", self.cpu_threads, 1, allow_none=True)
        for name in ("enable_chunked_prefill", "skip_tokenizer_init", "debug_checks", "engine_core_process",
                     "cuda_graphs"):
            check_bool(name, getattr(self, name))
        check_bool("enable_prefix_caching", self.enable_prefix_caching, allow_none=True)
        _check_choice("scheduler", self.scheduler, SCHEDULERS, SchedulerInterface, factory_ok=True)
        _check_choice("kv_cache", self.kv_cache, KV_CACHES, KVCacheManagerInterface)
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS, None)
        if self.engine_core is not None and not callable(self.engine_core):
            raise TypeError(
                f"engine_core must be an EngineCore subclass or a factory, got {type(self.engine_core).__name__}"
            )
        self.scheduling_policy = make_policy(self.scheduling_policy)  # the one policy object
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        if not isinstance(self.kv_cache_dtype, str):
            raise TypeError(
                f"kv_cache_dtype must be a name, got kv_cache_dtype={self.kv_cache_dtype!r} "
                f"({type(self.kv_cache_dtype).__name__}); one of {KV_CACHE_DTYPES}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
        self._check_conflicts()

    def _check_conflicts(self) -> None:
        if self.num_kv_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError(
                f"give num_kv_blocks={self.num_kv_blocks} or kv_cache_memory={self.kv_cache_memory}, "
                "not both: each one sets the size of the KV pool"
            )
        if self.enable_prefix_caching:
            if self.kv_cache == "contiguous":
                raise ValueError(
                    "enable_prefix_caching=True needs kv_cache='paged': the contiguous baseline "
                    "reserves one private region per request and cannot share blocks"
                )
            if self.scheduler == "static":
                raise ValueError(
                    "enable_prefix_caching=True does not combine with scheduler='static': the "
                    "static baseline reserves each request's worst case up front and never reuses blocks"
                )

    # --- derived settings --------------------------------------------------------------------
    @property
    def prefix_caching(self) -> bool:
        """Whether the built-in paged cache should cache prefixes (``None`` means: when it can)."""
        if self.enable_prefix_caching is not None:
            return self.enable_prefix_caching
        return self.kv_cache == "paged" and self.scheduler != "static"

    def token_budget(self, max_model_len: int) -> int:
        """``max_num_batched_tokens``, or the default: 2048 tokens per step, and without chunked
        prefill at least ``max_model_len`` (a whole prompt must fit in one step)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.enable_chunked_prefill:
            return DEFAULT_TOKEN_BUDGET
        return max(DEFAULT_TOKEN_BUDGET, max_model_len)

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        spec = self.speculative_config
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.token_budget(max_model_len),
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
            num_lookahead_tokens=spec.num_lookahead_tokens if spec else 0,
        )

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots a request reserves past its tokens (a draft model's own K/V; see
        ``SpeculativeConfig.num_lookahead_tokens``)."""
        return self.speculative_config.num_lookahead_tokens if self.speculative_config else 0


# --- limits the engine and the simulator derive the same way -----------------------------------
def resolve_max_model_len(args: EngineArgs, max_position_embeddings: int, sliding_window: int | None = None) -> int:
    """``args.max_model_len``, or the model's ``max_position_embeddings``. Refused beyond them,
    and beyond a sliding window (which minivllm does not implement)."""
    max_len = args.max_model_len or max_position_embeddings
    if max_len > max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_len} exceeds the model's max_position_embeddings={max_position_embeddings}"
        )
    if sliding_window is not None and sliding_window < max_len:
        raise ValueError(
            f"this model uses sliding-window attention (window {sliding_window}) which minivllm "
            f"does not implement; pass max_model_len <= {sliding_window}"
        )
    return max_len


def resolve_num_kv_blocks(
    args: EngineArgs, max_model_len: int, bytes_per_block: float, default_memory: Callable[[], float]
) -> int:
    """The KV pool's size in blocks: ``args.num_kv_blocks``, else ``args.kv_cache_memory`` (or,
    when neither is given, ``default_memory()`` bytes) over ``bytes_per_block``. Refused when it
    cannot hold one sequence of ``max_model_len`` tokens (:func:`check_kv_pool`)."""
    if args.num_kv_blocks is not None:
        num_blocks, source = args.num_kv_blocks, f"num_kv_blocks={args.num_kv_blocks}"
    else:
        memory = args.kv_cache_memory or default_memory()
        num_blocks = int(memory // bytes_per_block)
        source = f"{memory / 2**30:.2f} GiB at {bytes_per_block:.0f} bytes per block"
    check_kv_pool(num_blocks, args.block_size, max_model_len, source, args.num_lookahead_tokens)
    return num_blocks


def check_kv_pool(
    num_blocks: int, block_size: int, max_model_len: int, source: str = "", num_lookahead_tokens: int = 0
) -> None:
    """A KV pool must hold one sequence of ``max_model_len`` tokens (and the lookahead slots a
    draft model reserves past them), or a request could never run to its length limit."""
    needed = cdiv(max_model_len + num_lookahead_tokens, block_size)
    if num_blocks < needed:
        origin = f" (from {source})" if source else ""
        extra = f" plus {num_lookahead_tokens} lookahead slots for the draft model" if num_lookahead_tokens else ""
        raise ValueError(
            f"the KV cache holds {num_blocks} blocks ({num_blocks * block_size} tokens){origin} but one "
            f"max_model_len={max_model_len} sequence{extra} needs {needed} blocks; raise num_kv_blocks / "
            f"kv_cache_memory or lower max_model_len"
        )


def build_scheduler(args: EngineArgs, max_model_len: int, num_blocks: Callable[[], int]) -> SchedulerInterface:
    """The scheduler (with its KV cache manager) that ``args`` describe; its pool, a plug-in's
    included, must hold one sequence of ``max_model_len`` tokens (:func:`check_kv_pool`). With
    ``speculative_config`` both must implement speculative decoding's protocols
    (``SpeculativeScheduler``, ``SpeculativeKVCacheManager``): the static baseline and the
    contiguous cache do not, and a plug-in is told the member it lacks.

    ``num_blocks()`` sizes a built-in KV pool; it is not called when ``args`` bring their own
    manager (``kv_cache=<instance>``, or a scheduler instance that holds one).
    """
    scheduler = _build_scheduler(args, max_model_len, num_blocks)
    if args.speculative_config is not None:  # it verifies drafts and rolls back rejected ones
        check_implements(scheduler, SpeculativeScheduler, "scheduler")
        check_implements(scheduler.kv, SpeculativeKVCacheManager, "kv_cache")
    check_kv_pool(scheduler.kv.num_blocks, scheduler.kv.block_size, max_model_len,
                  num_lookahead_tokens=args.num_lookahead_tokens)
    return scheduler


def given_kv_cache_manager(args: EngineArgs) -> KVCacheManagerInterface | None:
    """The KV cache manager ``args`` bring (``kv_cache=<instance>``, or the one a
    ``scheduler=<instance>`` holds), or ``None`` when the engine builds its own."""
    if not isinstance(args.kv_cache, str):
        return args.kv_cache
    if not isinstance(args.scheduler, str) and not callable(args.scheduler):
        return args.scheduler.kv
    return None


def _build_scheduler(args: EngineArgs, max_model_len: int, num_blocks: Callable[[], int]) -> SchedulerInterface:
    sched_cfg = args.scheduler_config(max_model_len)
    if not isinstance(args.scheduler, str) and not callable(args.scheduler):  # an instance
        if not isinstance(args.kv_cache, str) and args.kv_cache is not args.scheduler.kv:
            raise ValueError("kv_cache= and scheduler= were given different KV cache managers")
        check_implements(args.scheduler.kv, KVCacheManagerInterface, "scheduler.kv")
        return args.scheduler
    kv = build_kv_cache_manager(args, max_model_len, num_blocks)
    if callable(args.scheduler) and not isinstance(args.scheduler, str):
        scheduler = args.scheduler(sched_cfg, kv)
        check_implements(scheduler, SchedulerInterface, "scheduler")
        return scheduler
    from minivllm.core.scheduler import Scheduler
    from minivllm.core.static_scheduler import StaticBatchScheduler

    cls = StaticBatchScheduler if args.scheduler == "static" else Scheduler
    return cls(sched_cfg, kv)


def build_engine_core(args: EngineArgs, scheduler: SchedulerInterface, executor, clock):
    """The step loop over ``scheduler`` and ``executor``: ``args.engine_core`` (a class or
    factory taking the same arguments as ``EngineCore``) or minivllm's own."""
    from minivllm.core.engine_core import EngineCore

    factory = args.engine_core or EngineCore
    return factory(scheduler, executor, clock=clock, debug_checks=args.debug_checks)


def build_kv_cache_manager(args: EngineArgs, max_model_len: int, num_blocks: Callable[[], int]):
    if not isinstance(args.kv_cache, str):
        kv = args.kv_cache
        if kv.block_size != args.block_size:
            raise ValueError(
                f"the kv_cache instance has block_size={kv.block_size} but block_size="
                f"{args.block_size}; give the same block size to both"
            )
        return kv
    from minivllm.core.contiguous_kv import ContiguousKVCacheManager
    from minivllm.core.kv_cache_manager import KVCacheManager

    if args.kv_cache == "contiguous":
        return ContiguousKVCacheManager(num_blocks(), args.block_size, max_model_len)
    return KVCacheManager(num_blocks(), args.block_size, args.prefix_caching)
