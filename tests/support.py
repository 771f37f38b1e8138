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
        + len(local_core(e).request_ids())
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


class FreeListKV:
    """Paged KV bookkeeping at its plainest, written from the protocols alone (a plug-in's view of
    ``KVCacheManagerInterface`` and ``SpeculativeKVCacheManager``): a stack of free block ids and
    one table per request. No prefix caching, no forking."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_ids)

    @property
    def num_reserved_slots(self) -> int:
        return self.num_used_blocks * self.block_size

    @property
    def num_referenced_blocks(self) -> int:
        return self.num_used_blocks

    def get_block_ids(self, request_id):
        return self.tables.get(request_id, [])

    def get_computed_blocks(self, request):
        return [], 0

    def allocate_slots(self, request, num_new_tokens, new_computed_blocks=(), num_lookahead_tokens=0):
        table = self.tables.get(request.request_id, [])
        end = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens
        need = -(-end // self.block_size) - len(table)
        if need > len(self.free_ids):
            return None
        table = self.tables.setdefault(request.request_id, table)
        table.extend(self.free_ids.pop() for _ in range(max(need, 0)))
        return table

    def free(self, request):
        self.free_ids.extend(reversed(self.tables.pop(request.request_id, [])))

    def trim(self, request, num_tokens):
        """Speculative decoding's rollback: the blocks past the first ``num_tokens`` slots go back."""
        table = self.tables.get(request.request_id)
        keep = -(-num_tokens // self.block_size)
        while table and len(table) > keep:
            self.free_ids.append(table.pop())

    def commit_written_blocks(self):
        pass

    def discard_unwritten_blocks(self):
        pass

    def check_invariants(self, live_request_ids=None):
        held = [b for t in self.tables.values() for b in t]
        assert len(set(held)) == len(held) and not set(held) & set(self.free_ids)
        assert len(held) + len(self.free_ids) == self.num_blocks
        if live_request_ids is not None:
            assert set(self.tables) <= set(live_request_ids)
