"""minivllm: a small, complete, measured LLM serving engine for learning how vLLM works.

The package imports lazily (PEP 562): ``import minivllm.core`` or ``import minivllm.sim`` loads
no torch, so the scheduler, the KV cache manager and the simulator run without it. Names
below load their module on first use: ``from minivllm import LLM`` imports the engine.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# a much smaller model with the tiny model's tokenizer, a draft for speculative decoding
# (see docs/tiny_model.md, "The draft model")
TINY_DRAFT_MODEL_DIR = str(Path(__file__).resolve().parent / "tiny_draft_model")

_LAZY = {
    "LLM": "minivllm.engine.llm",
    "LLMEngine": "minivllm.engine.llm_engine",
    "SamplingParams": "minivllm.sampling_params",
    "BeamSearchParams": "minivllm.sampling_params",
    "RequestOutput": "minivllm.outputs",
    "CompletionOutput": "minivllm.outputs",
    "TINY_MODEL_DIR": "minivllm.model.config",
    "TRITON_MODE": "minivllm.attention.triton_env",
    "local_core": "minivllm.engine.core_client",
}

__all__ = [
    "LLM", "LLMEngine", "SamplingParams", "BeamSearchParams", "RequestOutput", "CompletionOutput",
    "TINY_MODEL_DIR", "TINY_DRAFT_MODEL_DIR", "TRITON_MODE", "local_core",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from minivllm.attention.triton_env import TRITON_MODE
    from minivllm.engine.core_client import local_core
    from minivllm.engine.llm import LLM
    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.model.config import TINY_MODEL_DIR
    from minivllm.outputs import CompletionOutput, RequestOutput
    from minivllm.sampling_params import BeamSearchParams, SamplingParams


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
