"""``minivllm serve`` end to end, through the official ``openai`` client.

One server per module runs in a background thread on a free loopback port, with the engine core
in a process of its own as ``minivllm serve`` runs it; its greedy outputs are checked against
``LLM.generate`` with the same parameters (and chat prompts against Hugging Face's own
rendering of the chat template). What must hold whichever way the core runs -- a failed request
fails alone, a client that leaves frees its blocks, a dead core makes the server unhealthy, the
metrics -- is checked in both modes. The graceful-shutdown tests start the real command in a
subprocess and send it signals; one kills the server and checks that its core does not outlive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import minivllm  # noqa: E402
from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.engine.core_client import local_core  # noqa: E402
from minivllm.entrypoints import AsyncLLM  # noqa: E402
from minivllm.entrypoints.launcher import DEFAULT_MODEL_NAME, start_in_thread  # noqa: E402

MODEL = DEFAULT_MODEL_NAME
ENGINE_ARGS = {"max_num_seqs": 64, "seed": 0}
MODES = ("process", "thread")
PROMPTS = ["Once upon a time", "The little fox", "Mia had a red ball", "One sunny day, Leo"]


# --- fixtures and helpers -------------------------------------------------------------------
def serve(mode: str = "process", **engine_args):
    """A server in a thread of this process, its engine core in a process of its own
    (``minivllm serve``'s default) or in a thread."""
    max_waiting = engine_args.pop("max_waiting", None)
    llm = AsyncLLM.from_engine_args(max_waiting=max_waiting, engine_core_process=mode == "process", **engine_args)
    return start_in_thread(llm)


@pytest.fixture(scope="module")
def server():
    with serve(**ENGINE_ARGS) as srv:
        yield srv


@pytest.fixture(scope="module", params=MODES)
def mode_server(request):
    """A small server in each mode, whose core fails on cue (tests/core_faults.py): the tests
    that take it check what must hold whichever way the core runs."""
    from core_faults import FaultyCore

    with serve(request.param, max_num_seqs=8, seed=0, engine_core=FaultyCore) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference():
    return LLM(**ENGINE_ARGS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def read_metrics(url: str) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample of ``GET /metrics``."""
    text = httpx.get(url + "/metrics", timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def wait_until(predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def core_state(srv):
    """The engine core's own account (running, waiting, KV blocks in use, samples held)."""
    return srv.run(srv.llm.core_state())


def assert_idle(srv) -> None:
    """No request running or waiting, every KV block free: on the gauges and in the core."""
    wait_until(lambda: core_state(srv).num_unfinished == 0 and not srv.llm.output_processor.families,
               what="the engine to go idle")
    m = wait_until(
        lambda: (lambda m: m if m["minivllm_num_requests_running"] == 0 else None)(read_metrics(srv.url)),
        what="the running gauge to reach 0",
    )
    assert m["minivllm_num_requests_waiting"] == 0
    assert m["minivllm_kv_cache_usage_ratio"] == 0
    assert core_state(srv).kv_blocks_used == 0
    srv.run(srv.llm.check_invariants())


def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# --- completions and chat -------------------------------------------------------------------
def test_completions_greedy_match_llm_generate(client, reference):
    resp = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=24, temperature=0)
    want = reference.generate(PROMPTS, greedy(24), use_tqdm=False)
    assert [c.index for c in resp.choices] == list(range(len(PROMPTS)))
    assert [c.text for c in resp.choices] == [w.outputs[0].text for w in want]
    assert all(c.finish_reason in ("length", "stop") for c in resp.choices)
    assert resp.usage.prompt_tokens == sum(len(w.prompt_token_ids) for w in want)
    assert resp.usage.completion_tokens == sum(len(w.outputs[0].token_ids) for w in want)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_completion_from_token_ids_and_stop_string(client, reference):
    ids = reference.tokenizer("Once upon a time").input_ids
    resp = client.completions.create(model=MODEL, prompt=ids, max_tokens=40, temperature=0, stop=["."])
    want = reference.generate([ids], greedy(40, stop=["."]), use_tqdm=False)[0].outputs[0]
    assert resp.choices[0].text == want.text and "." not in want.text
    assert resp.choices[0].finish_reason == "stop"


def test_streamed_completion_equals_the_full_one_and_reports_usage(client, reference):
    stream = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    want = reference.generate([PROMPTS[1]], greedy(30), use_tqdm=False)[0]
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert "".join(c.choices[0].text for c in text_chunks) == want.outputs[0].text
    assert [c.choices[0].finish_reason for c in text_chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert all(c.usage is None for c in text_chunks)
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 30
    assert usage_chunk.usage.prompt_tokens == len(want.prompt_token_ids)


def test_a_stream_delivers_tokens_as_they_are_generated(mode_server, reference):
    """The core holds the request after its first tokens until the test opens a gate: the client
    has text by then, which it can only have had streamed (no timing involved, whatever the
    machine's speed); the rest follows, and the pieces join to the whole answer."""
    from core_faults import GATE_AFTER, GATED, gate_path

    k = 100 + os.getpid() % 800  # a gate of this test process's own
    gate = gate_path(k)
    gate.unlink(missing_ok=True)
    client = openai.OpenAI(base_url=mode_server.url + "/v1", api_key="unused", max_retries=0, timeout=90)
    want = reference.generate([GATED + [k]], greedy(12), use_tqdm=False)[0].outputs[0].text
    try:
        stream = iter(client.completions.create(model=MODEL, prompt=GATED + [k], max_tokens=12,
                                                temperature=0, stream=True))
        first = next(stream)  # the core is holding the request: at most GATE_AFTER + 1 tokens exist
        text = first.choices[0].text
        assert text and want.startswith(text) and len(text) < len(want), (
            f"the first piece must come while the core holds the request after {GATE_AFTER} tokens, "
            f"not with the whole answer: {text!r}")
        gate.touch()
        chunks = [first, *stream]
    finally:
        gate.unlink(missing_ok=True)
    assert "".join(c.choices[0].text for c in chunks) == want


def joined_by_index(chunks, chat: bool = False) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            piece = (c.delta.content or "") if chat else c.text
            texts[c.index] = texts.get(c.index, "") + piece
    return texts


def test_streamed_batch_of_prompts_and_echo(client, reference):
    want = reference.generate(PROMPTS[:3], greedy(10), use_tqdm=False)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=10, temperature=0,
                                            stream=True))
    assert joined_by_index(chunks) == {i: w.outputs[0].text for i, w in enumerate(want)}
    echoed = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPTS[0] + want[0].outputs[0].text
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0,
                                            echo=True, stream=True))
    assert joined_by_index(chunks)[0] == PROMPTS[0] + want[0].outputs[0].text


def test_n_choices_with_a_seed_match_llm_generate(client, reference):
    kw = {"n": 3, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    resp = client.completions.create(model=MODEL, prompt=PROMPTS[:2], max_tokens=12, **kw)
    want = reference.generate(PROMPTS[:2], SamplingParams(max_tokens=12, **kw), use_tqdm=False)
    assert [c.index for c in resp.choices] == list(range(6))
    assert [c.text for c in resp.choices] == [c.text for w in want for c in w.outputs]
    assert len({c.text for c in resp.choices}) > 1, "sampled choices should differ"


def hf_chat_ids(messages) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minivllm.TINY_MODEL_DIR)
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


def test_chat_greedy_matches_llm_generate_on_the_templated_prompt(client, reference):
    messages = [{"role": "system", "content": "You tell short stories."},
                {"role": "user", "content": "Tell me about a fox."}]
    want = reference.generate([hf_chat_ids(messages)], greedy(20), use_tqdm=False)[0]
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == want.outputs[0].text
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)

    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == want.outputs[0].finish_reason


def test_streamed_chat_with_n_choices_matches_the_full_response(client):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 12,
          "n": 2, "temperature": 1.0, "seed": 11}
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert [(c.index, c.delta.role) for c in chunks[0].choices] == [(0, "assistant"), (1, "assistant")]
    assert joined_by_index(chunks, chat=True) == {c.index: c.message.content for c in full.choices}
    finishes = {c.index: c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason}
    assert finishes == {c.index: c.finish_reason for c in full.choices}


def test_chat_default_max_tokens_fills_the_context(client, server):
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0,
        extra_body={"stop": ["\n"]},
    )
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens + resp.usage.completion_tokens <= server.llm.max_model_len


# --- batching and disconnects ----------------------------------------------------------------
def test_32_concurrent_streams_are_batched_and_get_their_own_tokens(server, reference):
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(32)]
    want = [o.outputs[0].text for o in reference.generate(prompts, greedy(16), use_tqdm=False)]
    before = read_metrics(server.url)

    async def one(aclient, prompt):
        stream = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                                  stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def run_all():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        async with aclient:
            return await asyncio.gather(*(one(aclient, p) for p in prompts))

    got = asyncio.run(run_all())
    assert got == want
    after = read_metrics(server.url)
    steps = after["minivllm_iteration_batch_size_count"] - before["minivllm_iteration_batch_size_count"]
    seqs = after["minivllm_iteration_batch_size_sum"] - before["minivllm_iteration_batch_size_sum"]
    single = (after['minivllm_iteration_batch_size_bucket{le="1.0"}']
              - before['minivllm_iteration_batch_size_bucket{le="1.0"}'])
    assert seqs / steps > 4, f"{seqs} sequences in {steps} steps: the engine did not batch the clients"
    assert single < steps
    assert after["minivllm_time_to_first_token_seconds_count"] - before["minivllm_time_to_first_token_seconds_count"] == 32
    assert after["minivllm_generation_tokens_total"] - before["minivllm_generation_tokens_total"] == 32 * 16
    assert_idle(server)


def aborts(url: str) -> float:
    return read_metrics(url).get('minivllm_request_success_total{finished_reason="abort"}', 0.0)


def test_client_that_disconnects_mid_stream_is_aborted_and_its_blocks_freed(mode_server):
    srv = mode_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    before = aborts(srv.url)
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1500, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    pieces = [next(iter(stream)).choices[0].text for _ in range(3)]
    assert all(isinstance(p, str) for p in pieces)
    assert core_state(srv).kv_blocks_used > 0
    stream.close()
    wait_until(lambda: aborts(srv.url) == before + 1, what="the abort")
    assert_idle(srv)
    # ...and the server still serves
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=3).usage.completion_tokens == 3


def test_client_that_gives_up_on_a_non_streaming_request_is_aborted(mode_server):
    srv = mode_server
    before = aborts(srv.url)
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=body, timeout=0.5)
    wait_until(lambda: aborts(srv.url) == before + 1, what="the abort")
    assert_idle(srv)


# --- errors ----------------------------------------------------------------------------------
BAD_BODIES = [
    # (endpoint, body, param named, text the message must contain)
    ("completions", {"prompt": "x", "temperature": -1}, "temperature", ">= 0"),
    ("completions", {"prompt": "x", "top_p": 0}, "top_p", "(0, 1]"),
    ("completions", {"prompt": "x", "n": 0}, "n", "[1, 128]"),
    ("completions", {"prompt": "x", "n": "two"}, "n", "integer"),
    ("completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", ">= 1"),
    ("completions", {"prompt": "x", "max_tokens": 4000}, "max_tokens", "2048"),
    ("completions", {"prompt": [5] * 2048, "max_tokens": 1}, "prompt", "2048"),
    ("completions", {"prompt": [5, 99999]}, "prompt", "[0, 1976)"),
    ("completions", {"prompt": []}, "prompt", "empty"),
    ("completions", {"prompt": ""}, "prompt", "empty"),
    ("completions", {"prompt": ["x", ""]}, "prompt", "prompt 1 is empty"),
    ("completions", {"prompt": "x", "stop": [""]}, "stop", "non-empty"),
    ("completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2}, "min_tokens", "max_tokens=2"),
    ("completions", {"prompt": "x", "presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ("completions", {"prompt": "x", "logprobs": 21}, "logprobs", "[0, 20]"),
    ("completions", {"prompt": "x", "temperature": True, "top_k": 1.5}, "top_k", "integer"),
    ("completions", {"temperature": 0.5}, "prompt", "required"),
    ("chat/completions", {"messages": []}, "messages", "at least 1"),
    ("chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages", "role"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages",
     "image_url"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools", "not supported"),
]


@pytest.mark.parametrize(("endpoint", "body", "param", "needle"), BAD_BODIES)
def test_bad_parameters_get_400_naming_the_field(server, endpoint, body, param, needle):
    resp = httpx.post(f"{server.url}/v1/{endpoint}", json={"model": MODEL, **body}, timeout=30)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert needle in err["message"], err["message"]


@pytest.mark.parametrize("raw", [b'{"prompt": "x", ', b"not json", b'["a", "list"]', b"",
                                 b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": Infinity}'])
def test_malformed_json_gets_400_and_the_server_keeps_serving(server, client, raw):
    resp = httpx.post(server.url + "/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_unknown_model_and_route_get_404(client, server):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    err = error_of(info.value)
    assert err["code"] == "model_not_found" and "gpt-4" in err["message"]
    assert httpx.get(server.url + "/v1/nothing").json()["error"]["type"] == "not_found_error"


def test_a_request_the_engine_fails_gets_an_error_and_the_server_goes_on(mode_server, reference):
    """A stop token id beyond the vocabulary is refused at the door (400 naming it). A request
    whose logits come out NaN is failed by the engine alone: its caller gets a 500 with the
    reason, a concurrent request and later ones are served as if nothing happened. A step that
    raises fails the requests in flight (500, or an error event on a stream) and no others."""
    from core_faults import BOOM, POISON

    srv = mode_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    bad = {"min_tokens": 2, "stop_token_ids": [1_000_000]}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, extra_body=bad)
    assert "1000000" in error_of(info.value)["message"]

    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL, prompt=POISON, max_tokens=8)
    assert "non-finite logits" in error_of(info.value)["message"]
    with pytest.raises(openai.APIError, match="non-finite logits"):  # the same, streamed
        list(client.completions.create(model=MODEL, prompt=POISON, max_tokens=8, stream=True))
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL, prompt=BOOM, max_tokens=8)
    assert "RuntimeError: boom in the model" in error_of(info.value)["message"]
    resp = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=16, temperature=0)
    assert_idle(srv)
    assert resp.choices[0].text == reference.generate([PROMPTS[3]], greedy(16), use_tqdm=False)[0].outputs[0].text
    failures = read_metrics(srv.url)["minivllm_request_failure_total"]
    assert failures >= 3


def test_logprobs_match_the_engine(client, reference):
    resp = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=2)
    want = reference.generate([PROMPTS[0]], greedy(6, logprobs=2), use_tqdm=False)[0].outputs[0]
    got = resp.choices[0].logprobs
    assert got.token_logprobs == pytest.approx([pos[t].logprob for t, pos in zip(want.token_ids, want.logprobs)])
    assert [len(top) for top in got.top_logprobs] == [2] * 6


# --- models, health, metrics ------------------------------------------------------------------
def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].max_model_len == server.llm.max_model_len
    assert httpx.get(server.url + "/health").status_code == 200


def test_metrics_are_valid_prometheus_text(mode_server):
    parser = pytest.importorskip("prometheus_client.parser")
    client = openai.OpenAI(base_url=mode_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    resp = httpx.get(mode_server.url + "/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in parser.text_string_to_metric_families(resp.text)}
    assert {name: f.type for name, f in families.items()} == {  # the same series in both modes
        "minivllm_num_requests_running": "gauge", "minivllm_num_requests_waiting": "gauge",
        "minivllm_kv_cache_usage_ratio": "gauge", "minivllm_prefix_cache_hit_rate": "gauge",
        "minivllm_num_preemptions": "counter", "minivllm_prompt_tokens": "counter",
        "minivllm_generation_tokens": "counter", "minivllm_request_success": "counter",
        "minivllm_request_failure": "counter", "minivllm_request_rejected": "counter",
        "minivllm_engine_steps": "counter", "minivllm_spec_decode_num_draft_tokens": "counter",
        "minivllm_spec_decode_num_accepted_tokens": "counter", "minivllm_time_to_first_token_seconds": "histogram",
        "minivllm_inter_token_latency_seconds": "histogram", "minivllm_e2e_request_latency_seconds": "histogram",
        "minivllm_iteration_batch_size": "histogram", "minivllm_num_requests_in_flight": "gauge",
        "minivllm_engine_core_up": "gauge", "minivllm_engine_core_silent_seconds": "gauge",
        "minivllm_http_connections_open": "gauge", "minivllm_http_connections_shed": "counter",
        "minivllm_http_accept_errors": "counter",
    }
    samples = read_metrics(mode_server.url)
    assert samples["minivllm_engine_steps_total"] >= 4 and samples["minivllm_generation_tokens_total"] >= 4
    assert samples["minivllm_iteration_batch_size_count"] == samples["minivllm_engine_steps_total"]
    ttft = {s.labels.get("le"): s.value for s in families["minivllm_time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")}
    counts = [ttft[k] for k in ttft]
    assert counts == sorted(counts) and ttft["+Inf"] >= 1, "buckets must be cumulative"


def test_prefix_cache_hit_rate_is_reported(server, client):
    system = " ".join(["The little fox ran to the big tree and saw a bird."] * 6)
    for tail in ("Then", "Later"):
        client.completions.create(model=MODEL, prompt=f"{system} {tail}", max_tokens=2)
    assert read_metrics(server.url)["minivllm_prefix_cache_hit_rate"] > 0


# --- load shedding -----------------------------------------------------------------------------
def test_full_queue_gets_503_with_retry_after():
    with serve(max_num_seqs=1, max_waiting=1) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        long = client.completions.create(model=MODEL, prompt="Once", max_tokens=1500, stream=True,
                                         extra_body={"ignore_eos": True})
        next(iter(long))  # the long request holds the only seat
        waiter = {}
        thread = threading.Thread(target=lambda: waiter.update(
            r=client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)))
        thread.start()
        wait_until(lambda: read_metrics(srv.url)["minivllm_num_requests_waiting"] == 1, what="one waiting")
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=3)
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"] == "1"
        err = error_of(info.value)
        assert err["code"] == "queue_full" and "max_waiting=1" in err["message"]
        long.close()  # frees the seat: the waiting request runs
        thread.join(60)
        assert waiter["r"].usage.completion_tokens == 3
        assert read_metrics(srv.url)['minivllm_request_rejected_total{reason="queue_full"}'] == 1


# --- graceful shutdown -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_sse(url: str, body: dict, events: list[str], first: threading.Event) -> None:
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                first.set()


LONG_STREAM = {"prompt": "Once", "max_tokens": 2000, "ignore_eos": True, "stream": True}


@pytest.mark.parametrize("mode", MODES)
def test_shutdown_drains_then_aborts_running_streams(mode):
    """The shutdown sequence in-process (the SIGTERM test below adds the real signal and the
    exit status): refuse new connections, give running requests the grace period, then end
    their streams with finish_reason "abort", free every block and stop the engine core."""
    llm = AsyncLLM.from_engine_args(max_num_seqs=4, engine_core_process=mode == "process")
    srv = start_in_thread(llm, grace=0.5)
    events: list[str] = []
    first = threading.Event()
    reader = threading.Thread(target=read_sse, args=(srv.url, LONG_STREAM, events, first))
    reader.start()
    assert first.wait(60)
    srv.server.handle_exit(signal.SIGTERM, None)
    reader.join(30)
    srv.thread.join(30)
    assert not reader.is_alive() and not srv.thread.is_alive()
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])["choices"][0]
    assert last["finish_reason"] == "abort", "2000 tokens cannot finish in a 0.5 s grace period"
    assert not llm.is_running
    if mode == "process":
        assert llm.engine.core_client.proc.returncode == 0, "the core process must have exited cleanly"
    else:
        assert not llm.engine.has_unfinished_requests() and local_core(llm).kv.num_used_blocks == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(srv.url + "/health", timeout=5)


def test_a_killed_core_fails_its_streams_and_the_server_reports_unhealthy():
    """The core process dies (SIGKILL): the stream in flight ends with an error event and
    [DONE], /health answers 503, new requests get 503 ``engine_unavailable``; /metrics still
    answers. The server does not restart the core (see docs/serving.md): a supervisor that
    watches /health restarts the whole server."""
    with serve(max_num_seqs=4) as srv:
        events: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=read_sse, args=(srv.url, LONG_STREAM, events, first))
        reader.start()
        assert first.wait(60)
        os.kill(srv.llm.engine.core_client.pid, signal.SIGKILL)
        reader.join(30)
        assert not reader.is_alive() and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == 503 and "SIGKILL" in error["message"], error
        health = httpx.get(srv.url + "/health", timeout=10)
        assert health.status_code == 503 and "not running" in health.json()["error"]["message"]
        resp = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=10)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
        assert httpx.get(srv.url + "/metrics", timeout=10).status_code == 200


@contextlib.contextmanager
def serve_process(*args: str):
    """``minivllm serve`` in a subprocess on a free port: yields ``(process, url)`` once healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "minivllm.cli", "serve", "--port", str(port), "--max-num-seqs", "4",
         "--log-level", "warning", *args],
        env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        def healthy():
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                return False

        wait_until(healthy, timeout=120, what="the server to start")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()


def core_of(server_pid: int) -> int:
    """The pid of the engine core process ``minivllm serve`` started (its one child)."""
    kids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == server_pid]
    assert len(kids) == 1, f"minivllm serve should have one child, the engine core; it has {kids}"
    return kids[0]


def _ppid(proc_dir: Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited; its parent has not collected it yet


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


@needs_proc
def test_the_core_process_dies_with_a_killed_server():
    """SIGKILL leaves the server no chance to stop its core: the core sees its socket close and
    exits by itself -- no engine holding the model and the KV cache is left behind."""
    with serve_process() as (proc, url):
        core = core_of(proc.pid)
        proc.kill()
        proc.wait(30)
        wait_until(lambda: gone(core), timeout=30, what="the orphaned core to exit")


@needs_proc
def test_sigterm_stops_accepting_ends_streams_and_exits_0():
    with serve_process("--shutdown-timeout", "2") as (proc, url):
        core = core_of(proc.pid)
        events: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=read_sse, args=(url, LONG_STREAM, events, first))
        reader.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):  # no new connections during the drain
            httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=5)
        reader.join(60)
        assert proc.wait(60) == 0, proc.stdout.read()
        assert gone(core), "the engine core must stop with the server"
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    # On a CPU the 2000 tokens take far longer than the 2 s grace: the stream is aborted.
    assert last["choices"][0]["finish_reason"] in ("abort", "length")
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert re.search(r"\w", text)


def test_a_second_signal_aborts_at_once_ends_streams_with_done_and_exits_non_zero():
    """SIGTERM starts a 120 s drain; Ctrl-C during it means "now": the stream still ends with
    an abort chunk and [DONE] (uvicorn's own second Ctrl-C cut it mid-stream, and the process
    exited 0 as if nothing had happened), and the status says a signal ended it (128 + 2)."""
    with serve_process("--shutdown-timeout", "120") as (proc, url):
        events: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=read_sse, args=(url, {**LONG_STREAM, "max_tokens": 2040}, events, first))
        reader.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        reader.join(60)
        assert proc.wait(60) == 128 + signal.SIGINT, proc.stdout.read()
        assert time.monotonic() - signalled < 60, "the second signal must not wait for the drain"
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"


def test_a_speculative_server_streams_the_same_text_and_counts_its_drafts(reference):
    """``--speculative-config``: a step may deliver several tokens of a request at once; the
    stream still adds up to the same greedy text, and /metrics counts drafts and acceptances."""
    draft = {"model": str(minivllm.TINY_DRAFT_MODEL_DIR), "num_speculative_tokens": 3, "disable_by_batch_size": None}
    with serve(speculative_config=draft, **ENGINE_ARGS) as srv:
        spec_client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for prompt in PROMPTS[:2]:
            chunks = list(spec_client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                                         stream=True))
            want = reference.generate([prompt], greedy(40), use_tqdm=False)[0].outputs[0].text
            assert "".join(c.choices[0].text for c in chunks) == want
        text = httpx.get(srv.url + "/metrics", timeout=10).text
    drafts = float(re.search(r"^\S*spec_decode_num_draft_tokens\S* (\S+)$", text, re.M).group(1))
    accepted = float(re.search(r"^\S*spec_decode_num_accepted_tokens\S* (\S+)$", text, re.M).group(1))
    assert drafts > 0 and 0 < accepted <= drafts


def test_the_2026_stack_from_the_command_line_serves_the_engines_text():
    """``--kv-cache-dtype int8 --speculative-config {...}``, parsed as ``minivllm serve`` parses
    them: the server's greedy text is that of ``LLM(...)`` with the same engine arguments, its
    pool holds the int8 layout's blocks (more than a float cache in the same memory) and its
    metrics count drafts."""
    import argparse

    from minivllm.entrypoints.cli_args import add_engine_arguments, engine_args_from

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": None})
    args = engine_args_from(parser.parse_args(["--kv-cache-dtype", "int8", "--speculative-config", spec,
                                               "--kv-cache-memory", str(8 << 20), "--max-num-seqs", "8",
                                               "--seed", "0"]))
    assert args.pop("engine_core_process")  # the server's default; serve() puts the core in a process
    want_llm = LLM(**args)
    with serve(**args) as srv:
        spec_client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        resp = spec_client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=24, temperature=0)
        blocks = core_state(srv).kv_blocks_total
        text = httpx.get(srv.url + "/metrics", timeout=10).text
    want = want_llm.generate(PROMPTS, greedy(24), use_tqdm=False)
    assert [c.text for c in resp.choices] == [w.outputs[0].text for w in want]
    float_blocks = local_core(LLM(kv_cache_memory=8 << 20, max_num_seqs=8, seed=0)).kv.num_blocks
    assert blocks == local_core(want_llm).kv.num_blocks > float_blocks  # the int8 layout, the same memory
    assert float(re.search(r"^\S*spec_decode_num_draft_tokens\S* (\S+)$", text, re.M).group(1)) > 0
