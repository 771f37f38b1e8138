"""Session fixtures: random Hugging Face checkpoints and the tiny model in transformers."""

from __future__ import annotations

import pytest
import torch
from support import FAMILIES, save_random_checkpoint

import minivllm


@pytest.fixture(scope="session")
def random_checkpoints(tmp_path_factory):
    """``{family: (path, hf_model)}`` for every supported family."""
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(f"ckpt_{fam}")
        out[fam] = (d, save_random_checkpoint(d, fam))
    return out


@pytest.fixture(scope="session")
def tiny_hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(minivllm.TINY_MODEL_DIR, dtype=torch.float32).eval()
