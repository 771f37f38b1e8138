"""What one HTTP client can no longer do to the others, against a real server on loopback.

One value that failed the whole batch (``top_k = 2**63``); one tenant reading another's prompt
through ``cached_tokens``; one big body (a 10 MB prompt, 100,000 chat messages) stalling every
stream; a lone surrogate; a client that sends half a request and waits; a server open to anyone
without a key. The server runs with its default limits except a short read timeout; a second
server checks ``--api-key``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.entrypoints import AsyncLLM  # noqa: E402
from minivllm.entrypoints.front_door import DoorOptions  # noqa: E402
from minivllm.entrypoints.launcher import DEFAULT_MODEL_NAME, start_in_thread  # noqa: E402

MODEL = DEFAULT_MODEL_NAME
ENGINE_ARGS = {"max_num_seqs": 16, "seed": 0, "block_size": 16}
READ_TIMEOUT = 1.0
PROMPTS = ["Once upon a time", "The little fox", "Mia had a red ball", "One sunny day, Leo"]
SECRET = ("You are the assistant of Acme Corp. The launch code is 4417 and the vault is behind the "
          "blue door on the third floor; never tell anyone.")


@pytest.fixture(scope="module")
def server():
    llm = AsyncLLM.from_engine_args(**ENGINE_ARGS, engine_core_process=True)  # as minivllm serve runs
    with start_in_thread(llm, door=DoorOptions(read_timeout=READ_TIMEOUT)) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference():
    return LLM(**ENGINE_ARGS)


def post(server, path: str, body: dict, timeout: float = 60, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{path}", json={"model": MODEL, **body}, timeout=timeout, **kw)


def error_of(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def stream_chunks(server, body: dict, times: list[float] | None = None) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120,
                      json={"model": MODEL, "stream": True, **body}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if times is not None:
                times.append(time.monotonic())
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def wait_idle(server) -> None:
    """Until the engine core holds no request and no KV block (as the core reports it)."""
    deadline = time.monotonic() + 30
    while (state := server.run(server.llm.core_state())).num_unfinished or server.llm.output_processor.families:
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.02)
    assert state.kv_blocks_used == 0


# --- one value no longer fails the batch ---------------------------------------------------------
def test_a_value_beyond_int64_or_the_vocabulary_is_a_400_and_the_other_streams_go_on(server, reference):
    want = [o.outputs[0].text for o in reference.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24),
                                                               use_tqdm=False)]
    got: dict[int, str] = {}

    async def streams():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            async def one(i):
                s = await client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=24, temperature=0,
                                                    stream=True)
                got[i] = "".join([c.choices[0].text async for c in s])

            async def attacker():
                await asyncio.sleep(0.05)
                return [await asyncio.to_thread(post, server, "completions", body) for body in (
                    {"prompt": "x", "top_k": 2**63, "max_tokens": 4},
                    {"prompt": "x", "top_k": 10**6, "max_tokens": 4},
                    {"prompt": "x", "stop_token_ids": [3] * 5000, "max_tokens": 4},
                    {"prompt": "x", "stop": ["s"] * 65, "max_tokens": 4},
                )]

            return (await asyncio.gather(*(one(i) for i in range(len(PROMPTS))), attacker()))[-1]

    refused = asyncio.run(streams())
    assert [got[i] for i in range(len(PROMPTS))] == want
    assert [r.status_code for r in refused] == [400, 400, 400, 400]
    errors = [error_of(r) for r in refused]
    assert [e["param"] for e in errors] == ["top_k", "top_k", "stop_token_ids", "stop"]
    assert "int64" in errors[0]["message"] and "vocabulary" in errors[1]["message"]
    wait_idle(server)


# --- tenants: cache_salt -------------------------------------------------------------------------
def cached(resp: httpx.Response) -> int:
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_keeps_tenants_out_of_each_others_prefix_cache(server):
    """An unsalted client (or one with another salt) sending a salted tenant's exact prompt gets
    no cached tokens; without the salt it would learn, block by block, that its guess is right."""
    prompt = SECRET + " User: hello"
    first = post(server, "completions", {"prompt": prompt, "max_tokens": 1, "cache_salt": "tenant-a-7f3c"})
    assert cached(first) == 0
    again = post(server, "completions", {"prompt": prompt, "max_tokens": 1, "cache_salt": "tenant-a-7f3c"})
    assert cached(again) >= 16, "the same salt shares its own prefix"
    assert cached(post(server, "completions", {"prompt": prompt, "max_tokens": 1})) == 0
    assert cached(post(server, "completions", {"prompt": prompt, "max_tokens": 1, "cache_salt": "tenant-b"})) == 0
    # ...and the unsalted copy now cached is not visible to the salted tenant either
    probe = SECRET + " User: bye"
    assert cached(post(server, "completions", {"prompt": probe, "max_tokens": 1})) >= 16
    assert cached(post(server, "completions", {"prompt": probe, "max_tokens": 1, "cache_salt": "tenant-c"})) == 0


def test_cache_salt_in_chat_and_its_validation(server):
    secret = "Only the chat tenant knows this: " + SECRET  # not cached by the test above
    messages = [{"role": "system", "content": secret}, {"role": "user", "content": "Hi"}]
    chat = {"messages": messages, "max_tokens": 1}
    assert cached(post(server, "chat/completions", {**chat, "cache_salt": "tenant-a"})) == 0
    assert cached(post(server, "chat/completions", {**chat, "cache_salt": "tenant-a"})) >= 16
    assert cached(post(server, "chat/completions", chat)) == 0
    for bad in ("", 7, ["a"]):
        resp = post(server, "completions", {"prompt": "x", "max_tokens": 1, "cache_salt": bad})
        assert resp.status_code == 400 and error_of(resp)["param"] == "cache_salt", resp.text


# --- big bodies are refused without stalling anyone ------------------------------------------------
def test_big_bodies_are_refused_while_a_stream_keeps_flowing(server):
    """A 10 MB prompt (5.5 s to tokenize on the event loop before) and a 100,000-message chat
    are refused while a stream runs; the stream's chunks keep arriving.

    The stream asks for far more tokens than it reads: the reader leaves (a client abort) only
    once a chunk has arrived after the refusals, so the overlap does not depend on how fast the
    machine is."""
    times: list[float] = []
    chunks: list[dict] = []
    started, refused = threading.Event(), threading.Event()
    refused_at: list[float] = []

    # logprobs: each chunk lists its tokens, so the tokens read are counted, not guessed from text
    body = {"prompt": PROMPTS[0], "max_tokens": 1800, "temperature": 0, "ignore_eos": True, "logprobs": 0}

    def stream():
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120,
                          json={"model": MODEL, "stream": True, **body}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    times.append(time.monotonic())
                    chunks.append(json.loads(line[6:]))
                    started.set()
                    if refused.is_set() and times[-1] > refused_at[0]:
                        return  # leaves mid-stream: the server aborts the request

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60)
    big_prompt = post(server, "completions", {"prompt": "hello world " * 900_000, "max_tokens": 4})
    many = post(server, "chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 100_000})
    long_text = post(server, "completions", {"prompt": "hello world " * 30_000, "max_tokens": 4})
    refused_at.append(time.monotonic())
    refused.set()
    reader.join(120)
    assert not reader.is_alive()
    assert chunks[-1]["choices"][0]["finish_reason"] is None, "the stream ended before the refusals did"
    gaps = [b - a for a, b in zip(times, times[1:])]
    # a liveness bound, not a speed test: the event loop never stops serving the stream for long
    # (how smoothly it streams on a busy machine is benchmarks/serving.py's to measure)
    assert max(gaps, default=0.0) < 30.0, f"the stream stalled for {max(gaps):.1f} s"
    assert big_prompt.status_code == 413 and error_of(big_prompt)["code"] == "request_too_large"
    assert many.status_code == 400 and error_of(many)["param"] == "messages"
    assert long_text.status_code == 400 and error_of(long_text)["param"] == "prompt"
    assert "characters" in error_of(long_text)["message"]
    for resp in (big_prompt, many, long_text):
        assert len(resp.content) < 1000, resp.content[:200]
    wait_idle(server)  # the abandoned stream was aborted and gave its blocks back
    # deltas a busy reader missed arrive merged (by design): however many pieces, the text so far
    # is the start of the whole greedy text
    # (re-encoding the text would undercount: generated tokens need not be the tokenizer's own
    # split of their text, and a long stream drifted by more than the margin)
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    read = sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks if c["choices"][0]["logprobs"])
    whole = post(server, "completions", {**body, "max_tokens": read + 8}).json()["choices"][0]["text"]
    assert whole.startswith(streamed), (read, streamed[-80:], whole[len(streamed) - 80:len(streamed) + 20])
    wait_idle(server)


def test_tokenizing_and_templating_run_off_the_event_loop(server, monkeypatch):
    llm = server.llm
    threads: list[str] = []

    def recorded(fn):  # calls on text (AsyncLLM.tokenize passes token ids through untouched)
        def wrapper(first, *args, **kwargs):
            if not isinstance(first, list) or first and isinstance(first[0], dict):
                threads.append(threading.current_thread().name)
            return fn(first, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(llm, "tokenize", recorded(llm.tokenize))
    monkeypatch.setattr(llm.tokenizer, "apply_chat_template", recorded(llm.tokenizer.apply_chat_template))
    assert post(server, "completions", {"prompt": "Hi", "max_tokens": 1}).status_code == 200
    assert post(server, "chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                             "max_tokens": 1}).status_code == 200
    prepare = [name for name in threads if name.startswith("minivllm-prepare")]
    assert len(prepare) >= 2 and "minivllm-http" not in threads, threads


def test_validation_messages_quote_a_short_piece_of_the_input(server):
    resp = post(server, "completions", {"prompt": "x", "max_tokens": "y" * 100_000})
    assert resp.status_code == 400 and error_of(resp)["param"] == "max_tokens"
    assert len(resp.content) < 1000


# --- text that is not Unicode --------------------------------------------------------------------
@pytest.mark.parametrize(("path", "body", "param"), [
    ("completions", {"prompt": "a \ud800 b"}, "prompt"),
    ("completions", {"prompt": ["fine", "bad \udfff"]}, "prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi \ud83d"}]}, "messages"),
    ("completions", {"prompt": "x", "stop": ["\ud800"]}, "stop"),
])
def test_lone_surrogates_get_a_400_naming_the_parameter(server, path, body, param):
    raw = json.dumps({"model": MODEL, "max_tokens": 2, **body})  # ASCII JSON: "\\ud800" as an escape
    resp = httpx.post(f"{server.url}/v1/{path}", content=raw, headers={"Content-Type": "application/json"},
                      timeout=60)
    assert resp.status_code == 400, resp.text
    err = error_of(resp)
    assert err["param"] == param and "not valid Unicode" in err["message"], err


# --- half-sent requests ----------------------------------------------------------------------------
def raw_request(server, data: bytes) -> tuple[bytes, float]:
    """Send ``data`` and wait for the server to answer or hang up: (what it sent, seconds)."""
    host, port = server.url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received, time.monotonic() - start


def test_a_client_that_sends_half_a_body_is_timed_out(server):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    received, seconds = raw_request(server, head + b'{"prompt": "x", ')
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert b"request_timeout" in received and b"connection: close" in received.lower()
    assert seconds < READ_TIMEOUT + 10


def test_a_client_that_sends_half_its_headers_is_disconnected(server):
    _, seconds = raw_request(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    assert seconds < READ_TIMEOUT + 10
    assert post(server, "completions", {"prompt": "Hi", "max_tokens": 2}).status_code == 200


# --- metrics count sequences --------------------------------------------------------------------------
def read_metrics(url: str) -> dict[str, float]:
    samples = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_finishes_and_aborts_are_both_counted_per_sequence(server):
    key = 'minivllm_request_success_total{{finished_reason="{}"}}'
    before = read_metrics(server.url)
    resp = post(server, "completions", {"prompt": "Hi", "max_tokens": 3, "n": 2, "ignore_eos": True})
    assert resp.status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        post(server, "completions", {"prompt": "Hi", "max_tokens": 1500, "n": 3, "ignore_eos": True}, timeout=0.5)
    wait_idle(server)
    deadline = time.monotonic() + 10
    while True:
        after = read_metrics(server.url)
        if after.get(key.format("abort"), 0) - before.get(key.format("abort"), 0) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert after[key.format("length")] - before.get(key.format("length"), 0) == 2
    assert after[key.format("abort")] - before.get(key.format("abort"), 0) == 3


# --- --api-key, /docs, /v1/models ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed_server():
    llm = AsyncLLM.from_engine_args(max_num_seqs=4)
    with start_in_thread(llm, door=DoorOptions(api_key="s3cret-key")) as srv:
        yield srv


def test_api_key_guards_v1_and_nothing_else(keyed_server):
    url = keyed_server.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
        resp = httpx.get(url + "/v1/models", headers=headers, timeout=10)
        assert resp.status_code == 401, resp.text
        err = error_of(resp)
        assert err["code"] == "invalid_api_key" and "s3cret" not in resp.text
        resp = httpx.post(url + "/v1/completions", headers=headers, json={"prompt": "Hi"}, timeout=10)
        assert resp.status_code == 401
    client = openai.OpenAI(base_url=url + "/v1", api_key="s3cret-key", max_retries=0, timeout=60)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/metrics", timeout=10).status_code == 200


def test_no_docs_and_no_paths_are_exposed(server, keyed_server):
    for url in (server.url, keyed_server.url):
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert httpx.get(url + path, timeout=10).status_code in (401, 404), path
    card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert card["root"] == MODEL and "/" not in json.dumps(card)
    resp = post(server, "completions", {"model": str(server.llm.engine.model_path), "prompt": "x"})
    assert resp.status_code == 404, "the model's path is not a name clients can probe"
