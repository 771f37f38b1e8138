"""The server's pieces that need no running server: the Prometheus text format, the mapping of
OpenAI requests to ``SamplingParams``, the chat template, log-probabilities in the API's shape,
and the ``minivllm serve`` flags generated from ``EngineArgs``."""

from __future__ import annotations

import argparse
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("fastapi")

import minivllm  # noqa: E402
from minivllm.config import EngineArgs  # noqa: E402
from minivllm.entrypoints import protocol as api  # noqa: E402
from minivllm.entrypoints.cli_args import (  # noqa: E402
    SERVER_ENGINE_DEFAULTS,
    add_serve_arguments,
    engine_args_from,
)
from minivllm.entrypoints.metrics import Counter, Histogram, ServerMetrics  # noqa: E402
from minivllm.model.loader import load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minivllm.TINY_MODEL_DIR)


# --- Prometheus text ------------------------------------------------------------------------
def test_histogram_buckets_are_cumulative_and_inclusive():
    h = Histogram("lat_seconds", "help", (0.1, 1.0, 10.0))
    for v in (0.05, 0.1, 0.5, 1.0, 20.0):  # 0.1 and 1.0 sit on an edge: le means <=
        h.observe(v)
    lines = dict(line.rsplit(" ", 1) for line in h.render() if not line.startswith("#"))
    assert lines['minivllm_lat_seconds_bucket{le="0.1"}'] == "2"
    assert lines['minivllm_lat_seconds_bucket{le="1.0"}'] == "4"
    assert lines['minivllm_lat_seconds_bucket{le="10.0"}'] == "4"
    assert lines['minivllm_lat_seconds_bucket{le="+Inf"}'] == "5"
    assert lines["minivllm_lat_seconds_count"] == "5"
    assert math.isclose(float(lines["minivllm_lat_seconds_sum"]), 21.65)
    with pytest.raises(ValueError, match="increase"):
        Histogram("bad", "help", (1.0, 1.0))


def test_counters_only_go_up_and_labels_are_escaped():
    c = Counter("things", "help", "reason")
    c.inc(2, 'a "quoted"\nlabel\\')
    assert c.render()[-1] == r'minivllm_things_total{reason="a \"quoted\"\nlabel\\"} 2.0'
    with pytest.raises(ValueError, match="only goes up"):
        c.inc(-1)


def test_the_whole_exposition_parses_with_prometheus_client():
    parser = pytest.importorskip("prometheus_client.parser")
    m = ServerMetrics()
    m.ttft.observe(0.02)
    m.finished.inc(label_value="stop")
    m.rejected.inc(label_value="queue_full")
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render())}
    assert families["minivllm_time_to_first_token_seconds"].type == "histogram"
    sample = next(s for s in families["minivllm_request_success"].samples)
    assert sample.labels == {"finished_reason": "stop"} and sample.value == 1


# --- requests -> SamplingParams ---------------------------------------------------------------
def chat(**kw) -> api.ChatCompletionRequest:
    return api.ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], **kw)


def test_chat_max_tokens_defaults_to_the_room_left_in_the_context():
    assert api.to_sampling_params(chat(), prompt_len=100, max_model_len=2048).max_tokens == 1948
    p = api.to_sampling_params(chat(max_tokens=50, max_completion_tokens=7), 100, 2048)
    assert p.max_tokens == 7, "max_completion_tokens wins over the deprecated max_tokens"
    with pytest.raises(api.InvalidRequestError, match="at most 1948, got 1949") as info:
        api.to_sampling_params(chat(max_completion_tokens=1949), 100, 2048)
    assert info.value.param == "max_completion_tokens"


def test_completion_fields_map_onto_sampling_params():
    req = api.CompletionRequest(prompt="x", n=2, temperature=0.5, top_p=0.9, top_k=-1, seed=3, stop="!",
                                min_tokens=2, max_tokens=9, stop_token_ids=[5], ignore_eos=True)
    p = api.to_sampling_params(req, 3, 2048)
    assert (p.n, p.temperature, p.top_p, p.top_k, p.seed, p.stop, p.min_tokens, p.max_tokens) == (
        2, 0.5, 0.9, 0, 3, ["!"], 2, 9)
    assert p.stop_token_ids == [5] and p.ignore_eos


@pytest.mark.parametrize(("fields", "param"), [
    ({"top_p": 1.5}, "top_p"), ({"temperature": -0.1}, "temperature"), ({"n": 129}, "n"),
    ({"frequency_penalty": 1.0}, "frequency_penalty"), ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"suffix": "end"}, "suffix"), ({"best_of": 3}, "best_of"), ({"prompt_logprobs": 1}, "prompt_logprobs"),
])
def test_refusals_name_the_parameter(fields, param):
    with pytest.raises(api.InvalidRequestError) as info:
        api.to_sampling_params(api.CompletionRequest(prompt="x", **fields), 1, 2048)
    assert info.value.param == param


def test_logprobs_settings_reach_the_engine():
    with pytest.raises(api.InvalidRequestError, match="requires logprobs=true"):
        api.to_sampling_params(chat(top_logprobs=2), 1, 2048)
    assert api.to_sampling_params(chat(logprobs=True, top_logprobs=2), 1, 2048).logprobs == 2
    assert api.to_sampling_params(chat(), 1, 2048).logprobs is None
    with pytest.raises(api.InvalidRequestError, match=r"\[0, 20\]"):
        api.to_sampling_params(api.CompletionRequest(prompt="x", logprobs=21), 1, 2048)


# --- chat template ----------------------------------------------------------------------------
@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Tell me a story."},
     {"role": "assistant", "content": "Once there was a fox."}, {"role": "user", "content": "More!"}],
])
def test_chat_prompt_matches_hugging_face_rendering(tokenizer, messages):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(minivllm.TINY_MODEL_DIR)
    want = list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    got = api.render_chat(tokenizer, api.ChatCompletionRequest(messages=messages))
    assert got == want
    assert got[0] == tokenizer.bos_token_id and got.count(tokenizer.bos_token_id) == 1


def test_text_parts_are_joined_and_other_parts_refused(tokenizer):
    parts = [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "a story."}]
    joined = api.ChatCompletionRequest(messages=[{"role": "user", "content": parts}])
    plain = api.ChatCompletionRequest(messages=[{"role": "user", "content": "Tell me a story."}])
    assert api.render_chat(tokenizer, joined) == api.render_chat(tokenizer, plain)
    image = api.ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(api.InvalidRequestError, match="image_url"):
        api.render_chat(tokenizer, image)


def test_a_tokenizer_without_a_template_is_refused():
    with pytest.raises(api.InvalidRequestError, match="no chat template"):
        api.render_chat(SimpleNamespace(chat_template=None), chat())


# --- log-probabilities --------------------------------------------------------------------------
def vllm_logprobs(logits: torch.Tensor, chosen: list[int], k: int) -> list[dict]:
    """What vLLM's CompletionOutput.logprobs holds: per token, the chosen token and the top k."""
    out = []
    for row, token in zip(torch.log_softmax(logits, dim=-1), chosen, strict=True):
        ranks = torch.argsort(row, descending=True).tolist()
        keep = dict.fromkeys([*ranks[:k], token])
        out.append({t: SimpleNamespace(logprob=float(row[t]), rank=ranks.index(t) + 1, decoded_token=None)
                    for t in keep})
    return out


def test_logprobs_in_the_completions_and_chat_shapes(tokenizer):
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    chosen = [10, int(logits[1].argmax()), 42]
    lps = vllm_logprobs(logits, chosen, k=2)
    texts = [tokenizer.decode([t]) for t in chosen]
    comp = api.completion_logprobs(tokenizer, chosen, lps, num_top=2, text_offset=5)
    assert comp["tokens"] == texts
    assert comp["token_logprobs"] == [lps[i][t].logprob for i, t in enumerate(chosen)]
    assert comp["text_offset"] == [5, 5 + len(texts[0]), 5 + len(texts[0]) + len(texts[1])]
    for row, top in zip(torch.log_softmax(logits, -1), comp["top_logprobs"], strict=True):
        best = torch.topk(row, 2)
        assert sorted(top.values(), reverse=True) == pytest.approx(best.values.tolist())
    content = api.chat_logprobs(tokenizer, chosen, lps, num_top=2)["content"]
    assert [c["token"] for c in content] == texts
    assert [c["bytes"] for c in content] == [list(t.encode()) for t in texts]
    assert all(len(c["top_logprobs"]) == 2 for c in content)
    assert content[1]["top_logprobs"][0]["logprob"] == content[1]["logprob"], "token 1 is the argmax"


# --- flags from EngineArgs ---------------------------------------------------------------------
def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_every_engine_argument_is_a_flag_and_absent_flags_keep_defaults():
    # absent flags keep the engine's defaults, except where the server has its own
    assert SERVER_ENGINE_DEFAULTS == {"engine_core_process": True}
    assert engine_args_from(parse(["--device", "cpu"])) == {"engine_core_process": True, "max_num_seqs": 128,
                                                             "device": "cpu"}
    assert engine_args_from(parse(["--device", "cuda:0"])) == {"engine_core_process": True, "device": "cuda:0"}
    args = parse(["some/model", "--max-num-seqs", "64", "--block-size", "32", "--no-enable-prefix-caching",
                  "--scheduler", "static", "--kv-cache-memory", "1000000", "--max-waiting", "5",
                  "--no-engine-core-process"])
    assert args.model == "some/model" and args.max_waiting == 5
    assert engine_args_from(args) == {"max_num_seqs": 64, "block_size": 32, "enable_prefix_caching": False,
                                      "scheduler": "static", "kv_cache_memory": 1000000,
                                      "engine_core_process": False}
    EngineArgs.from_kwargs(**engine_args_from(args))
    help_text = argparse.ArgumentParser()
    add_serve_arguments(help_text)
    flags = {opt for action in help_text._actions for opt in action.option_strings}
    for f in dataclasses.fields(EngineArgs):
        assert "--" + f.name.replace("_", "-") in flags, f.name


@pytest.mark.parametrize("argv", [["--scheduler", "fifo"], ["--max-num-seqs", "many"], ["--kv-cache", "x"]])
def test_bad_flags_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit):
        parse(argv)
    assert "invalid" in capsys.readouterr().err


# --- bounds checked before tokenizing -------------------------------------------------------------
def test_the_prompt_character_bound_holds_for_any_text(tokenizer):
    """A text of more than ``max_prompt_chars`` characters cannot fit in the context: every
    token covers at most as many characters as the longest vocabulary entry (docs/serving.md
    quotes the tiny model's bound)."""
    import random

    assert api.max_prompt_chars(tokenizer, 2048) == 2047 * 12 == 24_564
    longest = api.max_prompt_chars(tokenizer, 2)  # one token: the longest vocabulary entry
    rng = random.Random(0)
    words = list(tokenizer.get_vocab())
    for _ in range(50):
        text = "".join(rng.choice([rng.choice(words), " ", "\n", "é", "🦊", "xyz"]) for _ in range(200))
        assert len(text) <= len(tokenizer(text).input_ids) * longest, text[:80]


def test_counts_are_checked_before_the_body_becomes_objects():
    many = b'{"messages": [' + b",".join([b'{"role": "user", "content": "hi"}'] * 3000) + b"]}"
    with pytest.raises(api.InvalidRequestError, match="at most 2048 messages") as info:
        api.parse_body(many, api.ChatCompletionRequest, 2048)
    assert info.value.param == "messages"
    with pytest.raises(api.InvalidRequestError, match="malformed JSON"):
        api.parse_body(b"[" * 100_000, api.CompletionRequest, 2048)
    with pytest.raises(api.InvalidRequestError, match="the prompt has 5000 tokens"):
        api.parse_body(b'{"prompt": [' + b",".join([b"5"] * 5000) + b"]}", api.CompletionRequest, 2048)


def test_speculative_config_is_a_json_flag():
    args = parse(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": null}', "--device", "cpu"])
    engine = EngineArgs.from_kwargs(**engine_args_from(args))
    assert engine.speculative_config.disable_by_batch_size is None
    assert engine.speculative_config.method == "ngram"
    assert engine.speculative_config.num_speculative_tokens == 3
