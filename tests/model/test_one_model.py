"""One definition of the model: every step the default engine takes, prompt or decode, runs the
modules of ``minivllm/model/llama.py``. A student who edits ``DecoderLayer.forward`` (or sets a
breakpoint or a hook in it) changes, or stops in, decode as much as prefill."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import local_core
from minivllm.model.llama import DecoderLayer

PROMPTS = ["Once upon a time", "The little fox"]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _decode_only(meta) -> bool:
    """Every sequence of the step feeds one new token: a decode step."""
    return meta.query_lens_cpu is not None and all(n == 1 for n in meta.query_lens_cpu)


def test_an_edit_of_the_decoder_layer_changes_decode_in_the_default_engine(monkeypatch):
    """The edit leaves prompts alone and scales the MLP's share of decode steps: the first token
    (from the prompt's step) stays, the tokens after it change."""
    llm = LLM()
    before = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    original = DecoderLayer.forward
    seen = {"decode": 0, "other": 0}

    def edited(self, x, cos, sin, meta):
        if not _decode_only(meta):
            seen["other"] += 1
            return original(self, x, cos, sin, meta)
        seen["decode"] += 1
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x - 3.0 * self.mlp(self.post_attention_layernorm(x))  # the edit

    monkeypatch.setattr(DecoderLayer, "forward", edited)
    after = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    layers = llm.engine.model_config.num_layers
    assert seen["decode"] >= layers * (PARAMS.max_tokens - 1), seen  # every decode step, every layer
    assert seen["other"] >= layers, seen
    for b, a in zip(before, after, strict=True):
        assert a[0] == b[0]  # the prompt's step ran the original layer
    assert after != before, "an edit of DecoderLayer.forward did not change decode output"


@pytest.mark.parametrize("hook_on", ["layers", "mlp"])
def test_forward_hooks_fire_in_decode_steps(hook_on):
    """A forward hook on a module fires in decode steps too: nothing runs the model around it."""
    llm = LLM()
    model = local_core(llm).executor.model
    target = model.model.layers[0] if hook_on == "layers" else model.model.layers[0].mlp
    rows: list[int] = []
    handle = target.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    try:
        llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False)
    finally:
        handle.remove()
    assert rows.count(1) >= PARAMS.max_tokens - 1, rows  # one row per decode step of the one request
