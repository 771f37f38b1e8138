"""Load a Hugging Face checkpoint directory (or hub name) into :class:`LlamaFamilyModel`."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open

from minivllm.attention import AttentionBackend, get_attention_backend
from minivllm.core.interfaces import check_implements
from minivllm.model.config import TINY_MODEL_DIR, ModelConfig
from minivllm.model.layer_ops import layer_ops_for
from minivllm.model.llama import LlamaFamilyModel

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.json", "tokenizer*"]


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """A local directory is used as is; anything else is looked up on the Hugging Face hub."""
    if model is None:
        return Path(TINY_MODEL_DIR)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face checkpoint")
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), allow_patterns=_HUB_FILES))
    except Exception as exc:  # offline, unknown name, gated repo...
        raise FileNotFoundError(
            f"{model!r} is not a local checkpoint directory and could not be fetched from the "
            f"Hugging Face hub ({type(exc).__name__}: {exc}). Offline, use a local directory or "
            f"the shipped tiny model (minivllm.TINY_MODEL_DIR = {TINY_MODEL_DIR})."
        ) from exc


BF16_MIN_CAPABILITY = (8, 0)  # Ampere: the first NVIDIA GPUs with bfloat16 arithmetic


def auto_dtype(device: torch.device) -> torch.dtype:
    """The number format ``dtype="auto"`` means on ``device``: float32 on a CPU (CPU half
    precision is slow); on a CUDA GPU bfloat16 from compute capability 8.0 on (A100, L4, H100...),
    float16 below it (a T4 is sm_75). The capability decides, not
    ``torch.cuda.is_bf16_supported()``, which says True on a T4: torch emulates bfloat16 there,
    but the GPU has no bfloat16 arithmetic, so every bfloat16 operation is converted to and from
    float32 on the way."""
    if device.type != "cuda":
        return torch.float32
    capability = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if tuple(capability) >= BF16_MIN_CAPABILITY else torch.float16


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """A ``torch.dtype`` as given, a name from ``_DTYPES``, or ``"auto"`` (:func:`auto_dtype`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return auto_dtype(device)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


# checkpoint projection -> (our stacked parameter, which of its row slices)
_STACKED = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


def _stacked_rows(model: LlamaFamilyModel, stacked: str, shard: int) -> slice:
    """Rows of a stacked projection that hold checkpoint shard ``shard``."""
    cfg = model.config
    if stacked == "gate_up_proj":
        sizes = [cfg.intermediate_size] * 2
    else:
        sizes = [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
    start = sum(sizes[:shard])
    return slice(start, start + sizes[shard])


def checkpoint_target(model: LlamaFamilyModel, name: str) -> tuple[str, slice | None]:
    """Our parameter for checkpoint tensor ``name``, and the rows it fills (``None``: all)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _STACKED:
        stacked, shard = _STACKED[parts[-2]]
        return ".".join([*parts[:-2], stacked, parts[-1]]), _stacked_rows(model, stacked, shard)
    return name, None


def load_weights(model: LlamaFamilyModel, path: Path) -> None:
    """Copy every tensor of ``*.safetensors`` into the parameter (or rows of the stacked
    parameter) it belongs to; every parameter row must be filled exactly once."""
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}  # parameter -> rows filled so far
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue  # some old checkpoints store this buffer; we recompute it
                target, rows = checkpoint_target(model, name)
                if target not in params:
                    if name == "lm_head.weight" and model.config.tie_word_embeddings:
                        continue
                    raise KeyError(f"checkpoint tensor {name!r} has no matching parameter")
                param = params[target]
                dest = param if rows is None else param[rows]
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(dest.shape):
                    raise ValueError(
                        f"checkpoint tensor {name!r} in {file.name} has shape {tuple(tensor.shape)} "
                        f"but the model built from config.json expects {tuple(dest.shape)}"
                    )
                with torch.no_grad():
                    dest.copy_(tensor)
                filled[target] = filled.get(target, 0) + dest.shape[0]
    missing = [n for n, p in params.items() if filled.get(n, 0) != p.shape[0]]
    if model.config.tie_word_embeddings and "lm_head.weight" in missing:
        missing.remove("lm_head.weight")
    if missing:
        raise KeyError(f"checkpoint has no tensor (or not every part) for: {sorted(missing)[:5]}")


def load_model(
    model: str | os.PathLike | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    attention_backend: str | AttentionBackend = "auto",
) -> tuple[LlamaFamilyModel, Path]:
    """Build the decoder for a checkpoint and load its weights. Returns ``(model, path)``.
    ``attention_backend``: a name for :func:`~minivllm.attention.get_attention_backend`, or an
    object implementing the protocol (a plug-in), used as it is."""
    path = resolve_model_path(model)
    cfg = ModelConfig.from_file(path)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch_dtype = resolve_dtype(dtype, device)
    if isinstance(attention_backend, str):
        backend = get_attention_backend(attention_backend, device.type)
    else:
        check_implements(attention_backend, AttentionBackend, "attention_backend")
        backend = attention_backend
    layer_ops = layer_ops_for(device, torch_dtype)
    with torch.device("meta"):
        net = LlamaFamilyModel(cfg, backend, layer_ops)
    net = net.to_empty(device=device).to(torch_dtype)
    net.rotary.reset_parameters()  # to_empty leaves the (float32) RoPE buffer uninitialised
    if cfg.tie_word_embeddings:
        net.lm_head.weight = net.model.embed_tokens.weight
    load_weights(net, path)
    return net.eval(), path


def load_tokenizer(path: str | os.PathLike):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
