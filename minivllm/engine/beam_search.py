"""Beam search on the paged engine, with copy-on-write forks.

Each live beam is a request in the scheduler. At every step all live beams of a prompt have
their next-token log-probabilities computed in one batch; the ``2 * beam_width`` best
continuations over all beams are ranked by cumulative log-probability; the best
``beam_width`` that do not end (EOS) become the next beams. A beam chosen once continues in
place; a beam chosen twice is *forked*: the copy shares every KV block and only the block it
writes next gets copied. Beams nobody chose are freed. Continuations that end, and every
candidate at ``max_tokens``, are scored ``logprob / generated_len ** length_penalty`` and
kept if they are among the ``beam_width`` best finished ones.

The ranking and stopping rules are Hugging Face ``generate(num_beams=k, do_sample=False)``'s
(``early_stopping=False``): search stops when every candidate hits ``max_tokens``, or when all
``beam_width`` finished slots are filled and the best live beam, scored at its current
length, cannot beat the worst finished one.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class BeamSequence:
    token_ids: list[int]  # generated tokens (EOS included when it ended the beam)
    cum_logprob: float
    score: float  # cum_logprob / len ** length_penalty
    text: str = ""
    finished_by_eos: bool = False


@dataclass
class BeamSearchOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[BeamSequence]  # best first


@dataclass
class _Group:
    prompt: str | None
    prompt_ids: list[int]
    beams: list[tuple[Request, float]]  # live beams with their cumulative logprob
    finished: list[BeamSequence] = field(default_factory=list)
    improvable: bool = True
    done: bool = False


def run_beam_search(engine, prompts: list, params: BeamSearchParams) -> list[BeamSearchOutput]:
    if engine.has_unfinished_requests():
        raise RuntimeError("beam search needs an idle engine; finish or abort running requests first")
    if not engine.can_fork:
        raise ValueError("beam search forks requests: use scheduler='continuous', kv_cache='paged'")
    sched, runner = engine.scheduler, engine.runner
    eos = set(engine.eos_token_ids) if not params.ignore_eos else set()
    k = params.beam_width
    keep = 2 * k if eos else k
    beam_params = SamplingParams(temperature=0.0, max_tokens=params.max_tokens + 1, ignore_eos=True)
    counter = itertools.count()
    groups: list[_Group] = []
    for prompt in prompts:
        text, ids = engine.tokenize(prompt)
        engine.check_prompt(ids)
        if len(ids) + params.max_tokens > engine.max_model_len:
            raise ValueError(
                f"prompt of {len(ids)} tokens + max_tokens={params.max_tokens} exceeds "
                f"max_model_len={engine.max_model_len}"
            )
        req = Request(f"beam-{next(counter)}", ids, beam_params)
        sched.add_request(req)
        groups.append(_Group(text, ids, [(req, 0.0)]))

    pending: dict[str, torch.Tensor] = {}  # beam id -> its next-token logprobs
    while not all(g.done for g in groups):
        start = time.perf_counter()
        out = sched.schedule()
        reqs, logits = runner.compute_logits(out)
        if logits is not None:
            logprobs = torch.log_softmax(logits, dim=-1)
            for r, row in zip(reqs, logprobs):
                pending[r.request_id] = row
        for g in groups:
            if not g.done and all(b.request_id in pending for b, _ in g.beams):
                _advance(g, pending, sched, counter, eos, k, keep, params)
        engine.stats.record_step(sched, out, start, time.perf_counter() - start)
        if engine.args.debug_checks:
            engine.check_invariants()
    return [
        BeamSearchOutput(g.prompt, g.prompt_ids, [
            BeamSequence(s.token_ids, s.cum_logprob, s.score,
                         engine.tokenizer.decode(s.token_ids, skip_special_tokens=True), s.finished_by_eos)
            for s in g.finished
        ])
        for g in groups
    ]


def _advance(g: _Group, pending, sched, counter, eos: set[int], k: int, keep: int,
             params: BeamSearchParams) -> None:
    """One beam-search step for one prompt: choose continuations, fork, free, finish."""
    n_prompt = len(g.prompt_ids)
    cur_gen = g.beams[0][0].num_tokens - n_prompt  # tokens generated so far (same for all beams)
    rows = torch.stack([pending.pop(b.request_id) for b, _ in g.beams])  # [beams, V]
    totals = rows + torch.tensor([s for _, s in g.beams])[:, None]
    vocab = rows.shape[1]
    top_scores, top_idx = torch.topk(totals.flatten(), k=min(keep, totals.numel()))
    candidates = [(float(sc), int(i) // vocab, int(i) % vocab) for sc, i in zip(top_scores, top_idx)]
    at_limit = cur_gen + 1 >= params.max_tokens
    new_len = cur_gen + 1

    # finished candidates: only those ranked in the first k may be kept
    if g.improvable:
        for score, beam, token in candidates[:k]:
            if token in eos or at_limit:
                parent = g.beams[beam][0]
                gen = parent.all_token_ids[n_prompt:] + [token]
                g.finished.append(BeamSequence(gen, score, score / new_len**params.length_penalty,
                                               finished_by_eos=token in eos))
        g.finished.sort(key=lambda s: s.score, reverse=True)
        del g.finished[k:]

    survivors = [] if at_limit else [c for c in candidates if c[2] not in eos][:k]
    # Fork before appending: a child copies its parent's tokens as they are now.
    used: set[int] = set()
    new_beams: list[tuple[Request, float]] = []
    forks: list[tuple[Request, int]] = []
    for score, beam, token in survivors:
        parent = g.beams[beam][0]
        if beam in used:
            child = Request(f"{parent.request_id.split('/')[0]}/{next(counter)}", g.prompt_ids,
                            parent.sampling_params)
            sched.fork_request(parent, child)
            forks.append((child, token))
            new_beams.append((child, score))
        else:
            used.add(beam)
            forks.append((parent, token))
            new_beams.append((parent, score))
    dropped = [b.request_id for i, (b, _) in enumerate(g.beams) if i not in used]
    sched.finish_requests(dropped, RequestStatus.FINISHED_ABORTED)
    for req, token in forks:
        req.all_token_ids.append(token)
    g.beams = new_beams

    # stop rule (early_stopping=False): all k finished slots filled and the best live beam,
    # scored at its current length, cannot beat the worst finished one
    if g.beams and len(g.finished) == k:
        best_live = g.beams[0][1] / new_len**params.length_penalty
        g.improvable = best_live > g.finished[-1].score
    if at_limit or not g.improvable or not g.beams:
        sched.finish_requests([b.request_id for b, _ in g.beams], RequestStatus.FINISHED_ABORTED)
        g.beams, g.done = [], True
