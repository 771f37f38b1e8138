"""``AsyncLLM``: concurrent callers over one engine loop thread, without HTTP in the way.

Every test runs its callers in ``asyncio.run`` and bounds every wait, so a lost wake-up fails
the test instead of hanging it. After each test the engine must be idle with every KV block
free (design section 7).
"""

from __future__ import annotations

import asyncio

import pytest

from minivllm import LLM, LLMEngine, SamplingParams
from minivllm.entrypoints import AsyncLLM, EngineDeadError, QueueFullError, RequestFailedError
from minivllm.outputs import CompletionOutput, RequestOutput

PROMPTS = ["Once upon a time", "The little fox", "Mia had a red ball", "One sunny day, Leo",
           "The old owl said", "Sam and his dog"]
TIMEOUT = 60


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(max_num_seqs=8, seed=0)


@pytest.fixture(scope="module")
def reference():
    return LLM(max_num_seqs=8, seed=0)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


def long_request(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True, **kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


async def wait_idle(llm: AsyncLLM) -> None:
    """Until the loop has nothing in flight (the gauges are written by the loop thread)."""
    while llm.engine.has_unfinished_requests() or llm.metrics.running.value:
        await asyncio.sleep(0.01)


def assert_engine_clean(engine: LLMEngine) -> None:
    assert not engine.has_unfinished_requests()
    assert engine.kv.num_used_blocks == 0


async def collect(gen) -> list[RequestOutput]:
    return [out async for out in gen]


def test_concurrent_callers_get_llm_generate_outputs(engine, reference):
    want = reference.generate(PROMPTS, greedy(20), use_tqdm=False)

    async def main():
        llm = AsyncLLM(engine)
        try:
            return await asyncio.gather(*(collect(llm.generate(p, greedy(20))) for p in PROMPTS))
        finally:
            await llm.shutdown()

    streams = run(main())
    for outs, ref in zip(streams, want, strict=True):
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert outs[-1].outputs[0].text == ref.outputs[0].text
        assert outs[-1].outputs[0].token_ids == ref.outputs[0].token_ids
        texts = [o.outputs[0].text for o in outs]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "outputs must be cumulative"
    assert_engine_clean(engine)


def test_validation_errors_reach_the_caller_and_queue_nothing(engine):
    async def main():
        llm = AsyncLLM(engine)
        try:
            with pytest.raises(ValueError, match=f"max_model_len={engine.max_model_len}"):
                await llm.add_request([5] * engine.max_model_len, greedy(4))
            with pytest.raises(ValueError, match="empty"):
                await llm.add_request([], greedy(4))
            with pytest.raises(TypeError, match="token ids must be integers"):
                await llm.add_request([1, "two"], greedy(4))
            # the engine's own rules, checked on the caller's side (InputProcessor)
            with pytest.raises(ValueError, match="outside the vocabulary"):
                await llm.add_request([1, engine.model_config.vocab_size], greedy(4))
            with pytest.raises(ValueError, match="not valid Unicode"):
                await llm.add_request("a lone surrogate \ud800", greedy(4))
            with pytest.raises(TypeError, match="not bytes"):
                await llm.add_request(b"hi", greedy(4))
            with pytest.raises(TypeError, match="cache_salt must be a string"):
                await llm.add_request("hi", greedy(4), cache_salt=7)
            with pytest.raises(TypeError, match="SamplingParams"):
                await llm.add_request("hi", {"max_tokens": 4})
            assert not engine.has_unfinished_requests()
            first = await llm.add_request("hi", long_request(), request_id="same")
            with pytest.raises(ValueError, match="'same' is already in use"):
                await llm.add_request("hello", greedy(4), request_id="same")
            await first.aclose()
            await wait_idle(llm)
        finally:
            await llm.shutdown()

    run(main())
    assert_engine_clean(engine)


def test_a_request_id_that_names_a_sample_of_another_request_is_refused(engine):
    """``foo`` with n=2 runs as samples ``foo#0`` and ``foo#1``. Once ``foo#1`` had ended (here
    at a stop string, after 6 tokens, while ``foo#0`` runs on), a request ``foo#1`` was
    accepted, shared the sample's state, and its caller waited forever after ``foo`` ended."""
    params = SamplingParams(n=2, seed=7, max_tokens=200, temperature=1.0, stop=[" dog"], ignore_eos=True)

    async def main():
        llm = AsyncLLM(engine)
        try:
            stream = await llm.add_request(PROMPTS[0], params, request_id="foo")
            async for out in stream:
                if out.outputs[1].finish_reason is not None:
                    break
            assert out.outputs[0].finish_reason is None, "sample 0 must still be running"
            with pytest.raises(ValueError, match="'foo#1' is already in use"):
                await llm.add_request(PROMPTS[1], greedy(4), request_id="foo#1")
            rest = [o async for o in stream]
            assert rest[-1].finished
            await wait_idle(llm)
        finally:
            await llm.shutdown()

    run(main())
    assert_engine_clean(engine)


@pytest.mark.parametrize("how", ["aclose", "cancel"])
def test_a_caller_that_leaves_aborts_its_request_and_frees_its_blocks(engine, how):
    async def main():
        llm = AsyncLLM(engine)
        try:
            seen = []

            async def consume(gen):
                async for out in gen:
                    seen.append(out)

            gen = llm.generate(PROMPTS[0], long_request(n=2))
            if how == "aclose":
                for _ in range(3):
                    seen.append(await gen.__anext__())
                assert engine.kv.num_used_blocks > 0
                await gen.aclose()
            else:
                task = asyncio.create_task(consume(gen))
                while len(seen) < 3 and not task.done():
                    await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            await wait_idle(llm)
            assert not seen[-1].finished
            assert llm.metrics.finished.get("abort") == 2  # per sequence: n=2
            assert llm.metrics.kv_usage.value == 0
        finally:
            await llm.shutdown()

    run(main())
    assert_engine_clean(engine)


def test_explicit_abort_ends_the_stream_with_abort_and_the_partial_text(engine):
    async def main():
        llm = AsyncLLM(engine)
        try:
            stream = await llm.add_request(PROMPTS[1], long_request(n=2), request_id="r1")
            partial = [await stream.__anext__() for _ in range(2)][-1]
            await llm.abort("r1")
            rest = [out async for out in stream]
            final = rest[-1]
            assert final.finished and final.request_id == "r1"
            assert [c.finish_reason for c in final.outputs] == ["abort", "abort"]
            for before, after in zip(partial.outputs, final.outputs, strict=True):
                assert after.text.startswith(before.text) and len(after.token_ids) >= len(before.token_ids)
            await wait_idle(llm)
        finally:
            await llm.shutdown()

    run(main())
    assert_engine_clean(engine)


def test_an_abort_that_returns_the_final_outputs_is_passed_through(engine, monkeypatch):
    """After the engine-core rework ``abort_request`` returns the final outputs; the caller
    then gets the engine's own output rather than one the front end made up."""
    original = engine.abort_request

    def abort_and_report(ids):
        original(ids)
        ids = [ids] if isinstance(ids, str) else ids
        return [RequestOutput(rid, None, [1], [CompletionOutput(0, "from the engine", [7], "abort")], True)
                for rid in ids]

    monkeypatch.setattr(engine, "abort_request", abort_and_report)

    async def main():
        llm = AsyncLLM(engine)
        try:
            stream = await llm.add_request(PROMPTS[2], long_request(), request_id="r2")
            await stream.__anext__()
            await llm.abort("r2")
            final = [out async for out in stream][-1]
            assert final.outputs[0].text == "from the engine"
            await wait_idle(llm)
        finally:
            await llm.shutdown()

    run(main())
    assert_engine_clean(engine)


def test_an_exception_in_step_fails_the_callers_in_flight_and_the_loop_goes_on(engine, reference, monkeypatch):
    original, armed = engine.step, {"fail": False}

    def step():
        if armed["fail"]:
            armed["fail"] = False
            raise RuntimeError("boom in the model")
        return original()

    monkeypatch.setattr(engine, "step", step)
    want = reference.generate([PROMPTS[3]], greedy(12), use_tqdm=False)[0].outputs[0].text

    async def main():
        llm = AsyncLLM(engine)
        try:
            streams = [await llm.add_request(p, long_request()) for p in PROMPTS[:2]]
            for s in streams:
                await s.__anext__()
            armed["fail"] = True
            for s in streams:
                with pytest.raises(RequestFailedError, match="RuntimeError: boom in the model"):
                    async for _ in s:
                        pass
            await wait_idle(llm)
            assert llm.metrics.failed.get() == 2
            assert llm.is_running
            after = await collect(llm.generate(PROMPTS[3], greedy(12)))
            assert after[-1].outputs[0].text == want
        finally:
            await llm.shutdown()

    run(main())
    assert_engine_clean(engine)


def test_a_crash_of_the_loop_itself_fails_every_caller_instead_of_hanging(engine, monkeypatch):
    async def main():
        llm = AsyncLLM(engine)

        def broken(*args):
            raise KeyError("bug")

        monkeypatch.setattr(llm, "_record_outputs", broken)
        with pytest.raises(EngineDeadError, match="crashed"):
            await collect(llm.generate(PROMPTS[0], greedy(4)))
        assert not llm.is_running
        with pytest.raises(EngineDeadError):
            await llm.add_request(PROMPTS[0], greedy(4))
        await llm.shutdown()

    run(main())
    engine.abort_request([r.request_id for r in engine.scheduler.running])  # what the crash left
    assert_engine_clean(engine)


def test_shutdown_aborts_running_requests_and_refuses_new_ones(engine):
    async def main():
        llm = AsyncLLM(engine)
        stream = await llm.add_request(PROMPTS[4], long_request())
        await stream.__anext__()
        await llm.shutdown()
        final = [out async for out in stream][-1]
        assert final.finished and final.outputs[0].finish_reason == "abort"
        with pytest.raises(EngineDeadError, match="shut"):
            await llm.add_request(PROMPTS[0], greedy(4))

    run(main())
    assert_engine_clean(engine)


def test_max_waiting_refuses_requests_beyond_the_queue():
    engine = LLMEngine(max_num_seqs=1)

    async def main():
        llm = AsyncLLM(engine, max_waiting=2)
        try:
            running = await llm.add_request(PROMPTS[0], long_request())
            await running.__anext__()  # it holds the only seat
            waiting = [await llm.add_request(p, greedy(3)) for p in PROMPTS[1:3]]
            with pytest.raises(QueueFullError, match="max_waiting=2"):
                await llm.add_request(PROMPTS[3], greedy(3))
            assert llm.metrics.rejected.get("queue_full") == 1
            await running.aclose()
            for s in waiting:
                assert [out async for out in s][-1].outputs[0].finish_reason in ("length", "stop")
            await wait_idle(llm)
        finally:
            await llm.shutdown()

    run(main())
    assert_engine_clean(engine)
    with pytest.raises(ValueError, match="max_waiting must be an integer >= 1"):
        AsyncLLM(engine, max_waiting=0)
