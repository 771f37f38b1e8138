"""``AsyncLLM``: concurrent callers over one engine core, without HTTP in the way -- with the
core in a process of its own and in a thread of this one (``engine_core_process``).

One ``AsyncLLM`` per mode serves the module's tests from an event loop in a background thread
(a core process is started once, not per test); every wait is bounded, so a lost wake-up fails
a test instead of hanging it. After each test the core must be idle with every KV block free,
as the core itself reports (``AsyncLLM.core_state``). The core is ``tests/core_faults.py``'s
``FaultyCore``: minivllm's own until a request carries one of its marker prompts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest
from core_faults import BOOM, POISON, FaultyCore

from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import local_core
from minivllm.entrypoints import AsyncLLM, EngineDeadError, QueueFullError, RequestFailedError
from minivllm.entrypoints.async_llm import merge_delta
from minivllm.outputs import CompletionOutput, RequestOutput, RequestOutputKind

PROMPTS = ["Once upon a time", "The little fox", "Mia had a red ball", "One sunny day, Leo",
           "The old owl said", "Sam and his dog"]
TIMEOUT = 60
MODES = ("process", "thread")


class LoopThread:
    """An event loop in a thread of its own; ``run(coro)`` runs a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = TIMEOUT):
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop).result(timeout + 5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def loop():
    lt = LoopThread()
    yield lt
    lt.close()


def make(mode: str, **engine_args) -> AsyncLLM:
    max_waiting = engine_args.pop("max_waiting", None)
    return AsyncLLM.from_engine_args(max_waiting=max_waiting, engine_core_process=mode == "process",
                                     engine_core=FaultyCore, seed=0, **engine_args)


@pytest.fixture(scope="module", params=MODES)
def llm(request, loop):
    served = make(request.param, max_num_seqs=8)
    loop.run(served.start())
    yield served
    loop.run(served.shutdown())


@pytest.fixture(scope="module")
def reference():
    return LLM(max_num_seqs=8, seed=0)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


def long_request(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True, **kw)


async def idle(llm: AsyncLLM) -> None:
    """Until the core holds nothing: no sample, no KV block in use; the front end neither."""
    while True:
        state = await llm.core_state()
        if state.num_unfinished == 0 and state.kv_blocks_used == 0 and len(llm.output_processor) == 0:
            await llm.check_invariants()
            return
        await asyncio.sleep(0.01)


async def collect(gen) -> list[RequestOutput]:
    return [out async for out in gen]


def joined(outs: list[RequestOutput], index: int = 0) -> tuple[str, list[int]]:
    text, ids = "", []
    for out in outs:
        for c in out.outputs:
            if c.index == index:
                text += c.text
                ids += c.token_ids
    return text, ids


# --- outputs --------------------------------------------------------------------------------
def test_concurrent_callers_get_llm_generate_outputs_as_deltas(llm, loop, reference):
    want = reference.generate(PROMPTS, greedy(20), use_tqdm=False)

    async def main():
        streams = await asyncio.gather(*(collect(llm.generate(p, greedy(20))) for p in PROMPTS))
        await idle(llm)
        return streams

    for outs, ref in zip(loop.run(main()), want, strict=True):
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert joined(outs) == (ref.outputs[0].text, ref.outputs[0].token_ids)
        assert outs[-1].outputs[0].finish_reason == ref.outputs[0].finish_reason


def test_a_slow_reader_gets_the_deltas_it_missed_merged(llm, loop, reference):
    want = reference.generate([PROMPTS[1]], greedy(24, logprobs=2), use_tqdm=False)[0].outputs[0]

    async def main():
        stream = await llm.add_request(PROMPTS[1], greedy(24, logprobs=2))
        await asyncio.sleep(0.5)  # the request runs to its end meanwhile
        outs = [out async for out in stream]
        await idle(llm)
        return outs

    outs = loop.run(main())
    assert len(outs) < 24 and outs[-1].finished
    assert joined(outs) == (want.text, want.token_ids)
    assert [list(p) for o in outs for p in o.outputs[0].logprobs] == [list(p) for p in want.logprobs]


def test_final_only_gives_one_output_with_everything(llm, loop, reference):
    want = reference.generate(PROMPTS[:2], SamplingParams(n=2, seed=3, max_tokens=16), use_tqdm=False)[1]

    async def main():
        stream = await llm.add_request(PROMPTS[1], SamplingParams(n=2, seed=3, max_tokens=16),
                                       output_kind=RequestOutputKind.FINAL_ONLY)
        outs = [out async for out in stream]
        await idle(llm)
        return outs

    (out,) = loop.run(main())
    assert out.finished and [c.text for c in out.outputs] == [c.text for c in want.outputs]


def test_merge_delta_joins_completions_by_index():
    a = RequestOutput("r", None, [1], [CompletionOutput(0, "ab", [5, 6]), CompletionOutput(1, "x", [9])], False)
    b = RequestOutput("r", None, [1], [CompletionOutput(1, "yz", [8], "stop", "z")], True, num_cached_tokens=3)
    m = merge_delta(a, b)
    assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in m.outputs] == [
        (0, "ab", [5, 6], None), (1, "xyz", [9, 8], "stop")]
    assert m.finished and m.num_cached_tokens == 3


# --- validation and ids ---------------------------------------------------------------------
def test_validation_errors_reach_the_caller_and_queue_nothing(llm, loop):
    vocab = llm.vocab_size

    async def main():
        with pytest.raises(ValueError, match=f"max_model_len={llm.max_model_len}"):
            await llm.add_request([5] * llm.max_model_len, greedy(4))
        with pytest.raises(ValueError, match="empty"):
            await llm.add_request([], greedy(4))
        with pytest.raises(TypeError, match="token ids must be integers"):
            await llm.add_request([1, "two"], greedy(4))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await llm.add_request([1, vocab], greedy(4))
        with pytest.raises(ValueError, match="not valid Unicode"):
            await llm.add_request("a lone surrogate \ud800", greedy(4))
        with pytest.raises(TypeError, match="not bytes"):
            await llm.add_request(b"hi", greedy(4))
        with pytest.raises(TypeError, match="cache_salt must be a string"):
            await llm.add_request("hi", greedy(4), cache_salt=7)
        with pytest.raises(TypeError, match="SamplingParams"):
            await llm.add_request("hi", {"max_tokens": 4})
        assert (await llm.core_state()).num_unfinished == 0 and len(llm.output_processor) == 0
        first = await llm.add_request("hi", long_request(), request_id="same")
        with pytest.raises(ValueError, match="'same' is already in use"):
            await llm.add_request("hello", greedy(4), request_id="same")
        await first.aclose()
        await idle(llm)

    loop.run(main())


def test_a_request_id_that_names_a_sample_of_another_request_is_refused(llm, loop):
    """``foo`` with n=2 runs as samples ``foo#0`` and ``foo#1``. Once ``foo#1`` has ended (here
    at a stop string) while ``foo#0`` runs on, a request ``foo#1`` must still be refused."""
    params = SamplingParams(n=2, seed=7, max_tokens=200, temperature=1.0, stop=[" dog"], ignore_eos=True)

    async def main():
        stream = await llm.add_request(PROMPTS[0], params, request_id="foo")
        ended = set()
        async for out in stream:
            ended |= {c.index for c in out.outputs if c.finish_reason is not None}
            if 1 in ended:
                break
        assert 0 not in ended, "sample 0 must still be running"
        with pytest.raises(ValueError, match="'foo#1' is already in use"):
            await llm.add_request(PROMPTS[1], greedy(4), request_id="foo#1")
        rest = [o async for o in stream]
        assert rest[-1].finished
        await idle(llm)

    loop.run(main())


# --- leaving, aborting ------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["aclose", "cancel"])
def test_a_caller_that_leaves_aborts_its_request_and_frees_its_blocks(llm, loop, how):
    async def main():
        before = llm.metrics.finished.get("abort")
        seen = []

        async def consume(gen):
            async for out in gen:
                seen.append(out)

        gen = llm.generate(PROMPTS[0], long_request(n=2))
        if how == "aclose":
            for _ in range(3):
                seen.append(await gen.__anext__())
            assert (await llm.core_state()).kv_blocks_used > 0
            await gen.aclose()
        else:
            task = asyncio.create_task(consume(gen))
            while len(seen) < 3 and not task.done():
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await idle(llm)
        assert not seen[-1].finished
        assert llm.metrics.finished.get("abort") == before + 2  # per sequence: n=2
        while llm.metrics.kv_usage.value != 0:  # the core's next message brings the gauges down
            await asyncio.sleep(0.01)

    loop.run(main())


def test_explicit_abort_ends_the_stream_with_abort_and_the_partial_text(llm, loop):
    async def main():
        stream = await llm.add_request(PROMPTS[1], long_request(n=2), request_id="r1")
        first = [await stream.__anext__() for _ in range(2)]
        await llm.abort("r1")
        rest = [out async for out in stream]
        await idle(llm)
        return first, rest

    first, rest = loop.run(main())
    final = rest[-1]
    assert final.finished and final.request_id == "r1"
    assert sorted(c.finish_reason for c in final.outputs) == ["abort", "abort"]
    for index in (0, 1):
        text, ids = joined(first + rest, index)
        assert text.startswith(joined(first, index)[0]) and len(ids) >= len(joined(first, index)[1])


# --- failures ---------------------------------------------------------------------------------
def test_a_request_whose_row_cannot_be_sampled_fails_alone(llm, loop, reference):
    want = reference.generate([PROMPTS[2]], greedy(16), use_tqdm=False)[0].outputs[0].text

    async def main():
        before = llm.metrics.failed.get()
        good = asyncio.ensure_future(collect(llm.generate(PROMPTS[2], greedy(16))))
        with pytest.raises(RequestFailedError, match="non-finite logits"):
            await collect(llm.generate(POISON, greedy(8)))
        outs = await good
        await idle(llm)
        assert llm.metrics.failed.get() == before + 1
        return outs

    assert joined(loop.run(main()))[0] == want


def test_an_exception_in_step_fails_the_callers_in_flight_and_the_core_goes_on(llm, loop, reference):
    want = reference.generate([PROMPTS[3]], greedy(12), use_tqdm=False)[0].outputs[0].text

    async def main():
        before = llm.metrics.failed.get()
        streams = [await llm.add_request(p, long_request()) for p in PROMPTS[:2]]
        for s in streams:
            await s.__anext__()
        boom = await llm.add_request(BOOM, greedy(4))
        for s in [*streams, boom]:
            with pytest.raises(RequestFailedError, match="RuntimeError: boom in the model"):
                async for _ in s:
                    pass
        await idle(llm)
        assert llm.metrics.failed.get() == before + 3
        assert llm.is_running
        return await collect(llm.generate(PROMPTS[3], greedy(12)))

    assert joined(loop.run(main()))[0] == want


@pytest.mark.parametrize("mode", MODES)
def test_max_waiting_refuses_requests_beyond_the_queue(loop, mode):
    served = make(mode, max_num_seqs=1, max_waiting=2)

    async def main():
        running = await served.add_request(PROMPTS[0], long_request())
        await running.__anext__()  # it holds the only seat
        waiting = [await served.add_request(p, greedy(3)) for p in PROMPTS[1:3]]
        with pytest.raises(QueueFullError, match="max_waiting=2"):
            await served.add_request(PROMPTS[3], greedy(3))
        assert served.metrics.rejected.get("queue_full") == 1
        await running.aclose()
        for s in waiting:
            assert [out async for out in s][-1].outputs[0].finish_reason in ("length", "stop")
        await idle(served)
        await served.shutdown()

    loop.run(main())
    with pytest.raises(ValueError, match="max_waiting must be an integer >= 1"):
        AsyncLLM(served.engine, max_waiting=0)


@pytest.mark.parametrize("mode", MODES)
def test_shutdown_aborts_running_requests_and_refuses_new_ones(loop, mode):
    served = make(mode, max_num_seqs=4)

    async def main():
        stream = await served.add_request(PROMPTS[4], long_request())
        await stream.__anext__()
        await served.shutdown()
        final = [out async for out in stream][-1]
        assert final.finished and final.outputs[0].finish_reason == "abort"
        with pytest.raises(EngineDeadError, match="shut"):
            await served.add_request(PROMPTS[0], greedy(4))

    loop.run(main())
    if mode == "process":
        assert served.engine.core_client.proc.returncode == 0, "the core process must have exited cleanly"
    else:
        assert not served.engine.has_unfinished_requests() and local_core(served).kv.num_used_blocks == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_dead_core_fails_every_caller_instead_of_hanging(loop, mode, monkeypatch):
    """Thread mode: a bug in the core's loop kills its thread. Process mode: the core process
    is killed (SIGKILL). Either way every caller in flight gets EngineDeadError, nothing new is
    accepted, and ``is_running`` (what /health reports) turns false."""
    served = make(mode, max_num_seqs=4)

    async def main():
        streams = [await served.add_request(p, long_request()) for p in PROMPTS[:2]]
        for s in streams:
            await s.__anext__()
        if mode == "process":
            os.kill(served.engine.core_client.pid, signal.SIGKILL)
            why = "SIGKILL"
        else:
            from minivllm.core.core_loop import EngineCoreLoop

            def broken(self):
                raise KeyError("bug")

            monkeypatch.setattr(EngineCoreLoop, "step", broken)
            why = "crashed"
        for s in streams:
            with pytest.raises(EngineDeadError, match=why):
                async for _ in s:
                    pass
        assert not served.is_running
        with pytest.raises(EngineDeadError):
            await served.add_request(PROMPTS[0], greedy(4))
        await served.shutdown()

    loop.run(main())


def test_a_bug_while_handling_outputs_fails_the_callers_and_stops_the_core(loop, monkeypatch):
    served = make("process", max_num_seqs=4)

    async def main():
        stream = await served.add_request(PROMPTS[0], long_request())
        await stream.__anext__()

        def broken(deltas):
            raise KeyError("bug")

        monkeypatch.setattr(served.output_processor, "process", broken)
        with pytest.raises(EngineDeadError, match="handling the engine's outputs failed"):
            async for _ in stream:
                pass
        assert not served.is_running
        await served.shutdown()
        # every output that arrived after the bug found the core stopping: one stop, awaited
        # by shutdown(), not a task per output left running after it
        stopping = [t for t in asyncio.all_tasks() if "close" in t.get_coro().__qualname__ and not t.done()]
        assert not stopping, stopping

    loop.run(main())
    assert served.engine.core_client.proc.wait(30) is not None, "the core process must be gone"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["raises", "returns"])
def test_a_script_that_never_shuts_down_ends_quietly(mode, how):
    """A caller that raises (or just returns) without ``shutdown()``: the interpreter exits with
    the caller's own status, promptly, and prints nothing of the engine's threads or core
    process (no "terminate called without an active exception", no traceback but the caller's)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f'''
        import asyncio
        from minivllm import SamplingParams
        from minivllm.entrypoints import AsyncLLM

        async def main():
            llm = AsyncLLM.from_engine_args(seed=0, engine_core_process={mode == "process"})
            async for _ in llm.generate("Once upon a time", SamplingParams(max_tokens=4), request_id="a"):
                pass
            if {how == "raises"}:
                raise RuntimeError("the caller's own failure")

        asyncio.run(main())
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == (1 if how == "raises" else 0), out.stderr[-2000:]
    assert "terminate called" not in out.stderr and "Exception in thread" not in out.stderr, out.stderr[-2000:]
    if how == "raises":
        assert out.stderr.rstrip().endswith("RuntimeError: the caller's own failure"), out.stderr[-2000:]
    else:
        assert "Traceback" not in out.stderr, out.stderr[-2000:]
