"""``LLM(engine_core_process=True)``: the engine core in a process of its own gives the same
outputs as the core in this process, ends with its owner, and says clearly what it cannot do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from core_faults import POISON, FaultyCore

from minivllm import LLM, BeamSearchParams, SamplingParams
from minivllm.engine.core_client import EngineDeadError, local_core
from minivllm.metrics import EngineStats

PROMPTS = ["Once upon a time", "The little fox", "Mia had a red ball", "One sunny day, Leo"]
ARGS = {"max_num_seqs": 8, "seed": 0, "max_model_len": 512}


@pytest.fixture(scope="module")
def here():
    return LLM(**ARGS)


@pytest.fixture(scope="module")
def apart():
    llm = LLM(**ARGS, engine_core_process=True, engine_core=FaultyCore)
    yield llm
    llm.shutdown()


def logprob_entries(out) -> tuple[list, list[float]]:
    """Every log-probability of an output in a fixed order: what must match exactly (token,
    rank, decoded text) and the values."""
    keys, values = [], []
    for c in out.outputs:
        for pos in c.logprobs or []:
            for t, lp in sorted(pos.items()):
                keys.append((t, lp.rank, lp.decoded_token))
                values.append(lp.logprob)
    for pos in out.prompt_logprobs or []:
        for t, lp in sorted((pos or {}).items()):
            keys.append(t)
            values.append(lp.logprob)
    return keys, values


def state(llm: LLM):
    return llm.engine.core_client.call("state")


CASES = [
    SamplingParams(temperature=0, max_tokens=24),
    SamplingParams(temperature=0, max_tokens=40, stop=[" the", "."], include_stop_str_in_output=True),
    SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=5, max_tokens=16),
    SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2),
]


@pytest.mark.parametrize("params", CASES, ids=["greedy", "stop-strings", "n=3-seeded", "logprobs"])
def test_generate_gives_the_same_outputs_as_the_core_in_this_process(here, apart, params):
    """One prompt at a time, so that both cores batch alike (the core process steps as soon as
    a request is in, so a batch of prompts may be split differently there, and float rounding
    would then move log-probabilities and turn near-ties): the same tokens, texts, ends and
    log-probabilities."""
    for prompt in PROMPTS:
        (w,) = here.generate(prompt, params, use_tqdm=False)
        (g,) = apart.generate(prompt, params, use_tqdm=False)
        assert [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in g.outputs] == \
               [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in w.outputs]
        (g_keys, g_values), (w_keys, w_values) = logprob_entries(g), logprob_entries(w)
        assert g_keys == w_keys and g_values == pytest.approx(w_values, rel=1e-5, abs=1e-6)
        assert (g.prompt_logprobs is None) == (w.prompt_logprobs is None)
        assert g.metrics is not None and g.metrics.ttft is not None
    assert state(apart).num_unfinished == 0 and state(apart).kv_blocks_used == 0


def test_streamed_deltas_join_to_the_generated_outputs(here, apart):
    params = SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=20)
    for prompt in PROMPTS[:2]:
        want = here.generate(prompt, params, use_tqdm=False)[0]
        texts, ids = ["", ""], [[], []]
        for out in apart.stream(prompt, params):
            for c in out.outputs:
                texts[c.index] += c.text
                ids[c.index] += c.token_ids
        assert texts == [c.text for c in want.outputs] and ids == [c.token_ids for c in want.outputs]


def test_a_closed_stream_aborts_and_frees_the_blocks(apart):
    stream = apart.stream(PROMPTS[0], SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    for _ in range(3):
        next(stream)
    stream.close()
    deadline = time.monotonic() + 30
    while (s := state(apart)).num_unfinished or s.kv_blocks_used:
        assert time.monotonic() < deadline, s
        time.sleep(0.02)
    apart.engine.check_invariants()


def test_a_request_whose_row_fails_fails_alone(here, apart):
    outs = apart.generate([POISON, PROMPTS[1]], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error" and "non-finite" in outs[0].outputs[0].error
    assert outs[1].outputs[0].text == here.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8),
                                                    use_tqdm=False)[0].outputs[0].text


def test_statistics_come_from_the_core(apart):
    apart.reset_stats()
    apart.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    stats = apart.stats()
    assert isinstance(stats, EngineStats) and stats.summary()["output_tokens"] == 10
    assert stats.num_steps >= 5


def test_the_core_process_keeps_its_objects_and_runs_beam_search_there(here, apart):
    """Nothing of a core in its own process can be looked at here (``local_core`` says why), but
    everything reaches it through its client: beam search runs in the core process and gives the
    sequences of the core in this process."""
    with pytest.raises(ValueError, match="engine_core_process=False"):
        local_core(apart)
    params = BeamSearchParams(beam_width=2, max_tokens=5)
    there = apart.beam_search(PROMPTS[:2], params)
    assert [[(s.token_ids, s.text) for s in o.sequences] for o in there] == [
        [(s.token_ids, s.text) for s in o.sequences] for o in here.beam_search(PROMPTS[:2], params)]
    assert state(apart).num_unfinished == 0


def test_engine_arguments_that_cannot_reach_the_core_process_are_refused():
    class NotImportable(FaultyCore):  # defined in a function: the core process cannot find it
        pass

    with pytest.raises(TypeError, match="cannot be pickled.*engine_core_process=False"):
        LLM(**ARGS, engine_core_process=True, engine_core=NotImportable)
    with pytest.raises(TypeError, match="engine_core_process must be True or False"):
        LLM(engine_core_process="yes")


def test_a_core_that_cannot_be_built_raises_its_own_error_here():
    with pytest.raises(ValueError, match="num_kv_blocks=2") as info:
        LLM(engine_core_process=True, num_kv_blocks=2, max_model_len=512)
    assert "in the engine core process" in str(info.value.__cause__)


def test_ctrl_c_in_the_terminal_does_not_reach_the_core(apart, here):
    os.kill(apart.engine.core_client.pid, signal.SIGINT)  # as a terminal sends it to the group
    os.kill(apart.engine.core_client.pid, signal.SIGTERM)  # as a supervisor might
    params = SamplingParams(temperature=0, max_tokens=6)
    assert apart.generate(PROMPTS[2], params, use_tqdm=False)[0].outputs[0].text == \
        here.generate(PROMPTS[2], params, use_tqdm=False)[0].outputs[0].text


def test_a_dead_core_is_an_error_not_a_hang():
    llm = LLM(**ARGS, engine_core_process=True)
    os.kill(llm.engine.core_client.pid, signal.SIGKILL)
    with pytest.raises(EngineDeadError, match="SIGKILL"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=4), use_tqdm=False)


OWNER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from minivllm import LLM
    llm = LLM(max_model_len=256, engine_core_process=True)
    print(llm.engine.core_client.pid, flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), 9)
    # "exit": the interpreter ends without anyone calling shutdown()
""")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_the_core_process_ends_with_its_owner(how):
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", OWNER.format(root=root), how], capture_output=True, text=True,
                          timeout=120)
    core = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{core}").exists():
        stat = Path(f"/proc/{core}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            break
        assert time.monotonic() < deadline, f"the core process {core} outlived its owner ({how})"
        time.sleep(0.1)
