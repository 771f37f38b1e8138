"""The Llama-family decoder, its config and its checkpoint loader.

``minivllm.model.config`` needs no torch (the simulator reads ``config.json`` through it); the
decoder and the loader do, so they are imported on first use.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "ModelConfig": "minivllm.model.config",
    "SUPPORTED_ARCHITECTURES": "minivllm.model.config",
    "UnsupportedModelError": "minivllm.model.config",
    "LlamaFamilyModel": "minivllm.model.llama",
    "TINY_MODEL_DIR": "minivllm.model.config",
    "load_model": "minivllm.model.loader",
    "load_tokenizer": "minivllm.model.loader",
    "resolve_model_path": "minivllm.model.loader",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minivllm.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
