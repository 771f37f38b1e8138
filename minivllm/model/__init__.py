"""The Llama-family decoder, its config and its checkpoint loader."""

from minivllm.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from minivllm.model.llama import LlamaFamilyModel
from minivllm.model.loader import TINY_MODEL_DIR, load_model, load_tokenizer, resolve_model_path

__all__ = [
    "ModelConfig",
    "LlamaFamilyModel",
    "SUPPORTED_ARCHITECTURES",
    "UnsupportedModelError",
    "TINY_MODEL_DIR",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
