"""minivllm: a small, complete, measured LLM serving engine for learning how vLLM works."""

# Must run before anything defines a Triton kernel: picks compiled vs interpreted Triton.
from minivllm._triton_env import TRITON_MODE  # noqa: I001

from minivllm.engine.llm import LLM
from minivllm.engine.llm_engine import LLMEngine
from minivllm.model.loader import TINY_MODEL_DIR
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import BeamSearchParams, SamplingParams

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "LLMEngine",
    "SamplingParams",
    "BeamSearchParams",
    "RequestOutput",
    "CompletionOutput",
    "TINY_MODEL_DIR",
    "TRITON_MODE",
]
