"""Beam search on the paged engine against transformers ``generate(num_beams=k)``."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, BeamSearchParams
from minivllm.engine.core_client import local_core

PROMPTS = ["Once upon a time", "The little fox", "Tom went to the", "Q: What color is the sky?"]


@pytest.mark.parametrize("width", [2, 4])
def test_best_beam_matches_transformers(tiny_hf_model, width):
    llm = LLM(debug_checks=True)
    max_tokens = 40
    outs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=width, max_tokens=max_tokens))
    ended_by_eos = 0
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            ref = tiny_hf_model.generate(
                ids, attention_mask=torch.ones_like(ids), num_beams=width, do_sample=False,
                max_new_tokens=max_tokens, eos_token_id=2, pad_token_id=0,
            )[0, ids.shape[1]:].tolist()
        if 2 in ref:  # transformers pads finished beams; keep up to and including EOS
            ref = ref[: ref.index(2) + 1]
        best = out.sequences[0]
        assert best.token_ids == ref, f"{out.prompt!r}: beam {width}"
        ended_by_eos += best.finished_by_eos
        assert [s.score for s in out.sequences] == sorted((s.score for s in out.sequences), reverse=True)
    assert ended_by_eos > 0, "the test should cover beams that end with EOS"
    assert local_core(llm).kv.num_used_blocks == 0, "beam search leaked blocks"
    saved = max(s.kv_blocks_saved_by_sharing for s in llm.stats().steps)
    assert saved > 0, "beams should share KV blocks"


def test_beam_search_needs_an_idle_paged_engine():
    with pytest.raises(ValueError, match="kv_cache='paged'"):
        LLM(kv_cache="contiguous", max_model_len=256, num_kv_blocks=64).beam_search(
            "Once", BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(ValueError, match="beam_width must be >= 1"):
        BeamSearchParams(beam_width=0, max_tokens=4)
