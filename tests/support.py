"""Shared fixtures: small random Hugging Face checkpoints written to temporary directories.

Every checkpoint gets the shipped tiny model's tokenizer files, so the engine can load it like
any other model directory. Nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

import minivllm
from minivllm.engine.core_client import local_core

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def per_request_entries(llm) -> int:
    """Everything an ``LLM`` and its engine keep per request (statistics' bounded window aside)."""
    e = llm.engine
    return (
        len(e.output_processor.families) + len(e.output_processor.children)
        + len(local_core(e).scheduler.requests) + len(local_core(e).forks)
        + len(llm._inboxes)
    )


def assert_idle_and_empty(llm) -> None:
    """No request left, every KV block free, the KV manager's invariants hold."""
    assert not llm.engine.has_unfinished_requests()
    assert local_core(llm).kv.num_used_blocks == 0
    assert per_request_entries(llm) == 0
    llm.engine.check_invariants()


def tiny_vocab_size() -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(minivllm.TINY_MODEL_DIR) / "tokenizer.json")).get_vocab_size()


def save_random_checkpoint(tmp_dir: Path, family: str, seed: int = 0, **overrides):
    """Build a randomly initialised HF model of ``family`` and save it with our tokenizer."""
    import transformers as tf

    common = dict(
        vocab_size=tiny_vocab_size(), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
        "llama3": (
            tf.LlamaConfig,
            tf.LlamaForCausalLM,
            dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
                 rope_theta=500000.0),
        ),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(head_dim=32, num_key_value_heads=1)),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=None)),
    }
    cfg_cls, model_cls, extra = classes[family]
    torch.manual_seed(seed)
    cfg = cfg_cls(**{**common, **extra, **overrides})
    model = model_cls(cfg).eval()
    # Larger weights than the default init give peaked distributions, so greedy decoding is
    # not decided by float noise between near-tied logits.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(tmp_dir)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(minivllm.TINY_MODEL_DIR) / name, tmp_dir / name)
    return model


FAMILIES = ("llama", "llama3", "qwen2", "qwen3", "mistral")



def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    """Reference greedy continuation from transformers ``generate``."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos, pad_token_id=0,
            min_new_tokens=0 if eos is not None else max_new_tokens,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
    return out[0, len(prompt):].tolist()
