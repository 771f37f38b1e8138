"""minivllm: a small, complete, measured LLM serving engine for learning how vLLM works."""

# Must run before anything defines a Triton kernel: picks compiled vs interpreted Triton.
from minivllm._triton_env import TRITON_MODE  # noqa: I001

__version__ = "0.1.0"
