"""``max_num_seqs`` counts every sequence that runs: the forked siblings of ``n > 1`` and the
beams of beam search included.

A step listener watches every step: no step may run more sequences than ``max_num_seqs``, and
the answers must not change (greedy siblings equal the ``n = 1`` greedy output, seeded ones are
reproducible), with no block left behind. The HTTP server queues through
``LLMEngine.add_request`` into the same core, so these cases cover it too.
"""

from __future__ import annotations

import pytest

from minivllm import LLM, BeamSearchParams, SamplingParams
from minivllm.engine.core_client import local_core

PROMPT = "Once upon a time"


def watch_seats(llm: LLM) -> list[int]:
    """Sequences running in each step: those its plan computes, and those holding a seat after it."""
    core, seen = local_core(llm), []

    def listener(step) -> None:
        seen.append(max(len(step.plan.requests), len(core.scheduler.running)))

    core.add_step_listener(listener)
    return seen


def assert_idle(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 0
    assert local_core(engine).kv.num_used_blocks == 0 and not local_core(engine).scheduler.requests
    engine.check_invariants()


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_n_32_on_4_seats_never_runs_more_than_4_and_greedy_siblings_agree(prefix_caching):
    params = SamplingParams(n=32, temperature=0, max_tokens=8, ignore_eos=True)
    llm = LLM(max_num_seqs=4, enable_prefix_caching=prefix_caching, debug_checks=True)
    seats = watch_seats(llm)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    alone = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert max(seats) == 4, seats
    assert len(out.outputs) == 32 and [c.index for c in out.outputs] == list(range(32))
    assert {tuple(c.token_ids) for c in out.outputs} == {tuple(alone[0].outputs[0].token_ids)}
    assert all(c.finish_reason == "length" for c in out.outputs)
    assert_idle(llm)


def test_seeded_siblings_on_few_seats_are_reproducible():
    params = SamplingParams(n=32, temperature=1.0, top_k=20, max_tokens=12, seed=5, ignore_eos=True)
    runs = []
    for _ in range(2):
        llm = LLM(max_num_seqs=4, debug_checks=True)
        seats = watch_seats(llm)
        runs.append([c.token_ids for c in llm.generate(PROMPT, params, use_tqdm=False)[0].outputs])
        assert max(seats) <= 4, seats
        assert_idle(llm)
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) > 1  # seeds seed + i: different samples


def test_siblings_waiting_for_seats_end_with_their_first_token_or_an_abort():
    """max_tokens=1: a sibling that waits for a seat already has its only token and ends at
    once; an abort ends siblings that wait for a seat with the rest."""
    llm = LLM(max_num_seqs=2, debug_checks=True)
    seats = watch_seats(llm)
    out = llm.generate(PROMPT, SamplingParams(n=6, temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert [len(c.token_ids) for c in out.outputs] == [1] * 6 and max(seats) <= 2
    engine = llm.engine
    rid = engine.add_request(None, PROMPT, SamplingParams(n=6, temperature=1.0, seed=1, max_tokens=20))
    engine.step()
    assert len(local_core(engine).scheduler.running) == 2 and local_core(engine).scheduler.num_waiting == 4  # 1 leader, 5 siblings
    final = llm.abort(rid)
    assert {c.finish_reason for c in final[0].outputs} == {"abort"}
    assert_idle(llm)


def test_beam_search_keeps_its_beams_within_the_seats():
    params = BeamSearchParams(beam_width=4, max_tokens=8)
    wide = LLM()
    expected = [s.token_ids for s in wide.beam_search([PROMPT, "The little fox"], params)[0].sequences]
    llm = LLM(max_num_seqs=4, debug_checks=True)
    seats = watch_seats(llm)
    got = llm.beam_search([PROMPT, "The little fox"], params)
    assert [s.token_ids for s in got[0].sequences] == expected
    assert max(seats) <= 4, seats
    assert_idle(llm)


def test_beam_search_wider_than_the_seats_is_refused():
    llm = LLM(max_num_seqs=4)
    with pytest.raises(ValueError, match=r"beam_width=5.*max_num_seqs=4"):
        llm.beam_search([PROMPT], BeamSearchParams(beam_width=5, max_tokens=4))
    assert_idle(llm)
