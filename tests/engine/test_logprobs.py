"""``logprobs`` and ``prompt_logprobs`` against ``log_softmax`` of the transformers logits;
loading with another tokenizer, or none."""

from __future__ import annotations

import shutil

import pytest
import torch

import minivllm
from minivllm import LLM, SamplingParams

PROMPT = "Once upon a time there was a little fox who lived in a quiet forest"


def reference_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # row p: the distribution of token p + 1


@pytest.mark.parametrize("engine_args", [
    dict(),  # whole prompt in one step
    dict(max_num_batched_tokens=5, num_kv_blocks=3, max_model_len=48),  # chunks, preemption
], ids=["one_step", "chunked_preempted"])
def test_logprobs_match_transformers(tiny_hf_model, engine_args):
    llm = LLM(**engine_args)
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3, prompt_logprobs=2, ignore_eos=True)
    others = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * 2
    outs = llm.generate([PROMPT, "The little fox", "Tom went to"], [params, *others], use_tqdm=False)
    out = outs[0]
    prompt, gen = out.prompt_token_ids, out.outputs[0].token_ids
    ref = reference_logprobs(tiny_hf_model, prompt + gen)
    assert len(out.outputs[0].logprobs) == len(gen) == 8
    for j, (tok, pos) in enumerate(zip(gen, out.outputs[0].logprobs, strict=True)):
        row = ref[len(prompt) - 1 + j]
        assert pos[tok].logprob == pytest.approx(float(row[tok]), abs=1e-4)
        assert pos[tok].rank == 1  # greedy
        assert set(pos) == set(row.topk(3).indices.tolist()) | {tok}
        assert pos[tok].decoded_token == llm.tokenizer.decode([tok])
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(float(ref[len(prompt) - 1 + j][t]) for j, t in enumerate(gen)), abs=1e-3)
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    for p in range(1, len(prompt)):
        entry, tok = out.prompt_logprobs[p], prompt[p]
        assert entry[tok].logprob == pytest.approx(float(ref[p - 1][tok]), abs=1e-4)
        assert entry[tok].rank == int((ref[p - 1] > ref[p - 1][tok]).sum()) + 1
        assert len(entry) in (2, 3)  # the top 2, plus the prompt token when it is not among them
    if "num_kv_blocks" in engine_args:
        assert llm.stats().summary()["preemptions"] > 0


def test_streamed_logprobs_arrive_with_their_tokens():
    llm = LLM()
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=0)
    pieces = list(llm.stream(PROMPT, params, delta=True))
    assert sum(len(p.outputs[0].token_ids) for p in pieces) == 6
    for p in pieces:
        assert len(p.outputs[0].logprobs) == len(p.outputs[0].token_ids)


def test_another_tokenizer_or_none(tmp_path):
    bare = tmp_path / "no_tokenizer"
    shutil.copytree(minivllm.TINY_MODEL_DIR, bare)
    for f in bare.glob("*token*"):
        f.unlink()
    with pytest.raises(ValueError, match="skip_tokenizer_init=True"):
        LLM(str(bare))
    params = SamplingParams(temperature=0, max_tokens=10)
    want = LLM().generate(PROMPT, params, use_tqdm=False)[0]
    with_other = LLM(str(bare), tokenizer=minivllm.TINY_MODEL_DIR).generate(PROMPT, params, use_tqdm=False)[0]
    assert with_other.outputs[0].text == want.outputs[0].text
    ids_only = LLM(str(bare), skip_tokenizer_init=True)
    out = ids_only.generate([want.prompt_token_ids], params, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == want.outputs[0].token_ids and out.outputs[0].text == ""
    with pytest.raises(ValueError, match="no tokenizer"):
        ids_only.generate(PROMPT, params, use_tqdm=False)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        ids_only.generate([want.prompt_token_ids], SamplingParams(stop=["."]), use_tqdm=False)
