"""Serving entry points: :class:`AsyncLLM` (concurrent callers over one engine) and the
OpenAI-compatible HTTP server behind ``minivllm serve``."""

from minivllm.entrypoints.async_llm import (
    AsyncLLM,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
    RequestStream,
)

__all__ = ["AsyncLLM", "EngineDeadError", "QueueFullError", "RequestFailedError", "RequestStream"]
